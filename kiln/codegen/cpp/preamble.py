"""The text every kernel source starts with: kiln's C++ headers (kiln/native/include/) and the
special functions' C++ (kiln/codegen/special_functions.py), inlined so that a source's hash (the
compile cache key) covers everything it includes."""

from __future__ import annotations

import functools

from kiln.codegen.special_functions import cpp_source
from kiln.native import header_text


@functools.cache
def preamble(defines_flag: bool = True) -> str:
    """The headers' text, then the special functions'. One translation unit of a library defines
    the index-error flag and `kiln_lanes()`; the others declare the flag."""
    lanes = ['extern "C" int kiln_lanes() { return kiln::L; }'] if defines_flag else []
    return "\n".join([header_text(defines_flag=defines_flag), cpp_source(), *lanes])
