"""C++ built at run time for this machine, shared by the stages that need it.

`include/` holds kiln's C++ headers: the portable SIMD layer (kiln_vec.h), vector math, 16-bit
floats, and kiln's own GEMM (kiln_gemm.h). `build.py` compiles sources with `-march=native` into a
content-addressed disk cache and loads them. Code generation prints kernels on top of the headers
(kiln/codegen/cpp/), the runtime builds and loads them (kiln/runtime/), and the extern kernels build
the GEMM library from them (kiln/externs/kiln_gemm.py): one toolchain, one cache.
"""

from pathlib import Path

INCLUDE = Path(__file__).parent / "include"
