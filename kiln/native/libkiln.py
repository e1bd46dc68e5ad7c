"""libkiln, kiln's runtime library: builds it, loads it, and asks it about the packed weights it
holds. The library is the C functions of include/kiln_runtime.h over libtorch, which a graph's C++
wrapper calls for tensors and ATen operators (kiln/codegen/cpp_wrapper.py), and kiln's operators
(kiln::mm, kiln::conv, kiln::attention, ...; src/kiln_runtime.cpp) over the kernels' unit
(kernels_unit.py). Not the stage that runs compiled graphs (kiln/runtime/), which loads it.

Built once per machine, compiler and torch (its headers and libraries are the ones inside the
installed torch wheel; the torch version and ABI are part of the cache key) and loaded with its
symbols global, so graph libraries loaded after it resolve their calls into it.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Sequence

import torch

from kiln import config
from kiln.native import INCLUDE, kernels_unit  # the kernels kiln's operators run: a unit of the runtime
from kiln.native.build import build_library, cached_library

SOURCE = Path(__file__).parent / "src" / "kiln_runtime.cpp"
TEAM = Path(__file__).parent / "src" / "kiln_team.cpp"  # the threads kiln's parallel regions ask for
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
    return header + "\n" + TEAM.read_text() + "\n" + SOURCE.read_text() + "\n// Linked with kiln_runtime.map:\n" + exports


def build_arguments() -> tuple[list[str], list[str], list[str]]:
    """(sources, compile flags, link flags) of this process's runtime, as `build_library` takes them."""
    compile_flags, link_flags = torch_flags()
    # This runtime registers kiln's C++ operators with the dispatcher (kiln_runtime.cpp
    # KILN_OPERATOR); an exported model's copy of it does not (kiln/deploy/export.py).
    compile_flags.append("-DKILN_REGISTER_OPS")
    return [source(), kernels_unit.source()], compile_flags, [*link_flags, f"-Wl,--version-script={EXPORTS}"]


@functools.cache
def library_path() -> str:
    path, _ = build_library(*build_arguments(), own=True)
    return str(path)


@functools.cache
def library() -> ctypes.CDLL:
    """The runtime, loaded (built first when the C++ cache lacks it) with RTLD_GLOBAL. Loading it
    defines kiln's C++ operators (kiln::mm, kiln::conv, kiln::attention, ...) in the dispatcher: their fake functions are
    registered by kiln/externs/native_ops.py `load`, which Python code calls before it uses them."""
    lib = ctypes.CDLL(library_path(), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    lib.kiln_error.restype = ctypes.c_char_p
    lib.kiln_packs_held.restype = ctypes.c_int64
    lib.kiln_packed_bytes.restype = ctypes.c_int64
    lib.kiln_find_op.argtypes, lib.kiln_find_op.restype = [ctypes.c_char_p, ctypes.c_char_p], ctypes.c_void_p
    lib.kiln_buffer_cache_kept.restype = lib.kiln_buffer_arena_bytes.restype = ctypes.c_int64
    lib.kiln_team_narrowings.restype = lib.kiln_team_asks.restype = ctypes.c_int64
    lib.kiln_set_buffer_cache.argtypes = [ctypes.c_int64]
    _hand_over_settings(lib)
    return lib


def load_if_built() -> bool:
    """Load the runtime where it is built already (nothing is built now); whether it is loaded. A
    kernel library loaded after it sizes its parallel regions by the runtime's team
    (src/kiln_team.cpp); one loaded before finds no runtime and takes OpenMP's count."""
    if not library.cache_info().currsize:
        if cached_library(*build_arguments(), own=True) is None:
            return False
        library()
    return True


def _hand_over_settings(lib: ctypes.CDLL) -> None:
    lib.kiln_set_huge_pages(int(bool(config.backend.huge_pages)))
    lib.kiln_set_buffer_cache(max(0, int(config.runtime.buffer_cache_mb)) << 20)
    lib.kiln_set_adaptive_team(int(bool(config.runtime.adaptive_team)))


def apply_settings() -> None:
    """Hand the runtime the settings its packs and buffers are made under (backend.huge_pages,
    runtime.buffer_cache_mb) and its team's (runtime.adaptive_team), where this process has
    loaded it: the frozen program calls this before a first call makes its packs."""
    if library.cache_info().currsize:
        _hand_over_settings(library())


def team_narrowings() -> int:
    """Times kiln's team has taken a thread off since the process began, the cores being busy
    (src/kiln_team.cpp; 0 where this process has not loaded the runtime)."""
    return library().kiln_team_narrowings() if library.cache_info().currsize else 0


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
