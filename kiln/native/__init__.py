"""C++ built at run time for this machine, shared by the stages that need it.

`include/` holds kiln's C++ headers: the portable SIMD layer (kiln_vec.h), vector math, 16-bit
floats, and kiln's own kernels (kiln_gemm.h, kiln_depthwise.h, kiln_attention.h). `build.py`
compiles sources with `-march=native` into a content-addressed disk cache and loads them. Code
generation prints kernels on top of the headers (kiln/codegen/cpp/), the runtime builds and loads
them (kiln/runtime/), and kiln's runtime library (libkiln.py, src/kiln_runtime.cpp) is built with
the kernels' translation unit (kernels_unit.py): one toolchain, one cache.
"""

from pathlib import Path

INCLUDE = Path(__file__).parent / "include"

# The headers a kernel source starts with, in dependency order.
# (The special functions' C++ is generated beside the Triton helpers: kiln/codegen/special_functions.py.)
HEADERS = ("kiln_scalar.h", "kiln_team.h", "kiln_vec.h", "kiln_half.h", "kiln_vec_math.h")


def header_text(names: tuple[str, ...] = HEADERS, defines_flag: bool = True) -> str:
    """The text of headers `names`, inlined so that a source's hash (its cache key) covers
    everything it includes. One translation unit of a library defines the index-error flag
    that kiln_scalar.h declares; the others declare it extern."""
    texts = [(INCLUDE / name).read_text().replace("#pragma once", "") for name in names]
    flag = "int kiln_index_error = 0;" if defines_flag else "extern int kiln_index_error;"
    return "\n".join(text.replace("KILN_INDEX_ERROR_DECL", flag) for text in texts)
