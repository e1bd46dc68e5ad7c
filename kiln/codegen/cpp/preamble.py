"""The text every kernel source starts with: kiln's C++ headers (kiln/native/include/), inlined so
that a source's hash (the compile cache key) covers everything it includes."""

from __future__ import annotations

import functools

from kiln.native import header_text


@functools.cache
def preamble(defines_flag: bool = True) -> str:
    """The headers' text. One translation unit of a library defines the index-error flag and
    `kiln_lanes()`; the others declare the flag."""
    lanes = ['extern "C" int kiln_lanes() { return kiln::L; }'] if defines_flag else []
    return "\n".join([header_text(defines_flag=defines_flag), *lanes])
