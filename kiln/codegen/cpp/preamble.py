"""The text every kernel source starts with: kiln's C++ headers, inlined so that a source's hash
(the compile cache key) covers everything it includes."""

from __future__ import annotations

import functools
from pathlib import Path

from kiln.native import INCLUDE
HEADERS = ["kiln_scalar.h", "kiln_vec.h", "kiln_half.h", "kiln_vec_math.h", "kiln_special.h"]


@functools.cache
def preamble(defines_flag: bool = True) -> str:
    """The headers' text. One translation unit of a library defines the index-error flag and
    `kiln_lanes()`; the others declare the flag."""
    texts = [(INCLUDE / name).read_text().replace("#pragma once", "") for name in HEADERS]
    flag = "int kiln_index_error = 0;" if defines_flag else "extern int kiln_index_error;"
    lanes = ['extern "C" int kiln_lanes() { return kiln::L; }'] if defines_flag else []
    return "\n".join([texts[0].replace("KILN_INDEX_ERROR_DECL", flag), *texts[1:], *lanes])
