"""kiln's runtime library: the C functions of include/kiln_runtime.h over libtorch, which a graph's
C++ wrapper calls for tensors and ATen operators (kiln/codegen/cpp_wrapper.py).

Built once per machine, compiler and torch (its headers and libraries are the ones inside the
installed torch wheel; the torch version and ABI are part of the cache key) and loaded with its
symbols global, so graph libraries loaded after it resolve their calls into it.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from kiln.native import INCLUDE
from kiln.native.build import build_library

SOURCE = Path(__file__).parent / "src" / "kiln_runtime.cpp"
EXPORTS = Path(__file__).parent / "src" / "kiln_runtime.map"  # the linker's version script: kiln_* only


def torch_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for code built against the installed torch's libtorch."""
    root = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    compile_flags = [f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
                     f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DKILN_TORCH_VERSION=\"{torch.__version__}\"",
                     "-std=c++20", "-w", "-fvisibility=hidden"]
    lib = root / "lib"
    link_flags = [f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}"]
    return compile_flags, link_flags


def source() -> str:
    header = (INCLUDE / "kiln_runtime.h").read_text()
    # The version script rides along as a comment: the C++ cache's key covers what it exports.
    exports = "".join(f"// {line}\n" for line in EXPORTS.read_text().splitlines())
    return header + "\n" + SOURCE.read_text() + "\n// Linked with kiln_runtime.map:\n" + exports


@functools.cache
def library_path() -> str:
    from kiln.externs import kiln_gemm  # the GEMM kiln::mm's "kiln" implementation runs, a unit of the runtime

    compile_flags, link_flags = torch_flags()
    # This runtime registers kiln's C++ operators with the dispatcher (kiln_runtime.cpp
    # KILN_OPERATOR); an exported model's copy of it does not (kiln/deploy/export.py).
    compile_flags.append("-DKILN_REGISTER_OPS")
    path, _ = build_library([source(), kiln_gemm.source()], compile_flags,
                            [*link_flags, f"-Wl,--version-script={EXPORTS}"], own=True)
    return str(path)


@functools.cache
def library() -> ctypes.CDLL:
    """The runtime, loaded (built first when the C++ cache lacks it) with RTLD_GLOBAL. Loading it
    defines kiln's C++ operators (kiln::attention) in the dispatcher: their fake functions are
    registered by kiln/externs/native_ops.py `load`, which Python code calls before it uses them."""
    lib = ctypes.CDLL(library_path(), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    lib.kiln_error.restype = ctypes.c_char_p
    lib.kiln_packs_held.restype = ctypes.c_int64
    lib.kiln_packed_bytes.restype = ctypes.c_int64
    return lib


def packed_bytes(weight: torch.Tensor) -> int:
    """Bytes of the packed forms kiln's runtime holds for `weight` (0 when this process has not
    loaded the runtime: then it holds none)."""
    if not library.cache_info().currsize:
        return 0
    (handle,) = handles_of([weight])
    try:
        return library().kiln_packed_bytes(ctypes.c_void_p(handle))
    finally:
        tensors_of([handle])  # released


def drop_packs(weight: torch.Tensor) -> None:
    """Drop the packed forms kiln's runtime holds for `weight` (none when this process has not
    loaded the runtime)."""
    if not library.cache_info().currsize:
        return
    (handle,) = handles_of([weight])
    try:
        library().kiln_drop_packs(ctypes.c_void_p(handle))
    finally:
        tensors_of([handle])  # released


# Tensors to handles and back: torch's own converters (torch._C._aoti) make a new at::Tensor per
# tensor, and take ownership of handles, each in a capsule.
_CAPSULE_POINTER = ctypes.pythonapi.PyCapsule_GetPointer
_CAPSULE_POINTER.argtypes, _CAPSULE_POINTER.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p
_NEW_CAPSULE = ctypes.pythonapi.PyCapsule_New
_NEW_CAPSULE.argtypes, _NEW_CAPSULE.restype = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p], ctypes.py_object


def handles_of(tensors: Sequence[torch.Tensor]) -> list[int]:
    """A new owned handle (an at::Tensor*) per tensor: whoever receives them releases them."""
    return [_CAPSULE_POINTER(c, None) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(list(tensors))]


def tensors_of(handles: Sequence[int]) -> list[torch.Tensor]:
    """The tensors of owned handles, which this releases."""
    return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([_NEW_CAPSULE(h, None, None) for h in handles])


def _native(tensors: Sequence[torch.Tensor | None], call: Callable[[list[ctypes.c_void_p], Any], int]) -> torch.Tensor:
    """`call(handles, out)` of a runtime function, with a borrowed handle per tensor (NULL for
    None), its result taken back as a tensor."""
    present = iter(handles_of([t for t in tensors if t is not None]))
    handles = [ctypes.c_void_p(next(present) if t is not None else None) for t in tensors]
    out = ctypes.c_void_p()
    status = call(handles, ctypes.byref(out))
    tensors_of([h.value for h in handles if h.value is not None])  # released
    if status:
        raise RuntimeError(library().kiln_error().decode())
    return tensors_of([out.value])[0]


def _scalars(values: Sequence[float]) -> Any:
    return (KilnArg * max(len(values), 1))(*[KilnArg(3, 0, float(v), None, 0) for v in values])


# The implementations of kiln::mm the runtime's `mm` runs (kiln_runtime.cpp), those of
# kiln/externs/prepacked.py's MM_IMPLS.
MM_IMPLS = ("aten", "aten_kn", "aten_nk", "kiln", "mkl", "onednn")


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, unary: str, scalars: Sequence[float | None],
       algorithm: str | None, impl: str) -> torch.Tensor:
    """The runtime's kiln::mm, called from Python as a C++ wrapper's graph calls it: through kiln's
    CPython extension (python_door.py), ~0.3 µs beyond the runtime's own work, where a ctypes call
    with handles took ~8. The autotuner times the GEMM candidates through it; tests compare it with
    kiln/externs/prepacked.py."""
    call, entry, error, k_block = _mm_door()
    return call(entry, error, a, b, bias, unary, scalars, algorithm or None, impl, k_block)


@functools.cache
def _mm_door() -> tuple[Callable[..., torch.Tensor], int, int, int]:
    """The extension's `mm`, the addresses of the runtime's `kiln_mm` and `kiln_error`, and kiln's
    GEMM's K blocking: looked up once, not in every timed call."""
    from kiln.externs import kiln_gemm
    from kiln.native import python_door

    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    return python_door.module().mm, address(library().kiln_mm), address(library().kiln_error), kiln_gemm.K_BLOCK


def _mm_row_norm(tensors: list, eps: float, kind: str, total: ctypes.c_void_p | None = None) -> torch.Tensor:
    """The runtime's `kiln_mm_row_norm` over (a, b, bias, residual, weight, norm_bias)."""
    from kiln.externs import kiln_gemm

    return _native(tensors, lambda h, out: library().kiln_mm_row_norm(
        *h, ctypes.c_double(eps), ctypes.c_int32(kiln_gemm.ROW_NORMS[kind]), ctypes.c_int64(kiln_gemm.K_BLOCK), out,
        ctypes.byref(total) if total is not None else None))


def mm_layer_norm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                  weight: torch.Tensor | None, norm_bias: torch.Tensor | None, eps: float, rms: bool = False) -> torch.Tensor:
    """The runtime's kiln::mm_layer_norm, called from Python (likewise)."""
    from kiln.externs import kiln_gemm

    return _mm_row_norm([a, b, bias, residual, weight, norm_bias], eps, kiln_gemm.norm_kind(rms))


def mm_add_layer_norm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                      weight: torch.Tensor | None, norm_bias: torch.Tensor | None,
                      eps: float, rms: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The runtime's kiln::mm_add_layer_norm, called from Python (likewise): (the sum, its norm)."""
    from kiln.externs import kiln_gemm

    total = ctypes.c_void_p()
    normed = _mm_row_norm([a, b, bias, residual, weight, norm_bias], eps, kiln_gemm.norm_kind(rms), total)
    return tensors_of([total.value])[0], normed


def mm_softmax(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
               log: bool = False) -> torch.Tensor:
    """The runtime's kiln::mm_softmax, called from Python (likewise)."""
    from kiln.externs import kiln_gemm

    return _mm_row_norm([a, b, bias, residual, None, None], 0.0, kiln_gemm.softmax_kind(log))


def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], groups: int, unary: str, scalars: Sequence[float],
         algorithm: str | None, other: torch.Tensor | None, impl: str) -> torch.Tensor:
    """The runtime's kiln::conv, called from Python (likewise)."""
    from kiln.externs import kiln_gemm

    ints = lambda values: (ctypes.c_int64 * len(values))(*values)  # noqa: E731
    return _native([x, weight, bias, other], lambda h, out: library().kiln_conv(
        h[0], h[1], h[2], ints(stride), ints(padding), ctypes.c_int64(len(padding)), ints(dilation),
        ctypes.c_int64(len(stride)), ctypes.c_int64(groups), unary.encode(), _scalars(scalars),
        ctypes.c_int64(len(scalars)), algorithm.encode() if algorithm else None, h[3], impl.encode(),
        ctypes.c_int64(kiln_gemm.K_BLOCK), out))


class KilnArg(ctypes.Structure):
    """kiln_arg of kiln_runtime.h."""
    _fields_ = [("kind", ctypes.c_int32), ("i", ctypes.c_int64), ("d", ctypes.c_double), ("p", ctypes.c_void_p),
                ("n", ctypes.c_int64)]
