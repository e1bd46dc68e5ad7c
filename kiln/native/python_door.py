"""kiln's door from Python into C++: the `kiln_python` extension (src/kiln_python.cpp).

A C++ wrapper's graph call from Python used to hand each tensor over as a capsule made by torch's
converters and read back through ctypes: ~0.4 µs a tensor, for every weight of a frozen model on
every call. The extension turns the call's tensors into handles and the results back directly
(`GraphCall`), stamps a list of tensors (`stamp`: identity, version, data pointer) so that
frozen weights are checked in one comparison, checks a tensor against a guard's expectation
(`TensorCheck`: ~30 ns against ~0.4 µs in Python) and tells whether dicts, instance dicts and
closure cells changed (`Watch`: the guards that read only those are skipped while none did).

Built once per machine, compiler, Python and torch into the cache of kiln's own libraries
(`cache.runtime_dir`; the Python and torch include paths and the torch version are in its key) and
imported from there.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

from kiln.native.build import build_library, cached_library

SOURCE = Path(__file__).parent / "src" / "kiln_python.cpp"


def _flags() -> tuple[list[str], list[str]]:
    from kiln.native import libkiln

    compile_flags, link_flags = libkiln.torch_flags()
    return ([*compile_flags, f"-I{sysconfig.get_paths()['include']}", f"-DKILN_PYTHON_VERSION=\"{sys.version.split()[0]}\""],
            [*link_flags, "-ltorch_python"])


def _source() -> str:
    # The runtime's interface inlined (its kiln_arg, kiln_mm's signature): the cache key covers it.
    from kiln.native import INCLUDE

    return (INCLUDE / "kiln_runtime.h").read_text() + "\n" + SOURCE.read_text()


_building = threading.Lock()


def module() -> ModuleType:
    """The `kiln_python` extension, built first when the C++ cache lacks it."""
    with _building:  # one build and one import, whichever thread asks first
        return _module()


def build_in_background() -> None:
    """Start building the extension in a thread, beside whatever this thread builds next (kiln's
    runtime: together they take ~15 s on 2 cores on a machine's first compile, one after the other
    ~25 s)."""
    if not _module.cache_info().currsize:
        threading.Thread(target=module, name="kiln-python-door-build", daemon=True).start()


def build_arguments() -> tuple[list[str], list[str], list[str]]:
    """(sources, compile flags, link flags) of this process's extension, as `build_library` takes them."""
    return [_source()], *_flags()


@functools.cache
def _module() -> ModuleType:
    path, _ = build_library(*build_arguments(), own=True)
    loader = importlib.machinery.ExtensionFileLoader("kiln_python", str(path))
    spec = importlib.util.spec_from_file_location("kiln_python", str(path), loader=loader)
    extension = importlib.util.module_from_spec(spec)
    loader.exec_module(extension)
    return extension


def built_module() -> ModuleType | None:
    """The extension when this process has it or the C++ cache holds it; None (nothing is built,
    no compiler is needed) otherwise."""
    if _module.cache_info().currsize:
        return module()
    try:
        found = cached_library(_source(), *_flags(), own=True)
    except (OSError, subprocess.CalledProcessError):  # no compiler here: nothing can be cached either
        found = None
    return module() if found is not None else None


def graph_call(entry: Any, error: Any, num_outputs: int, build: bool = True,
               runtime: ctypes.CDLL | None = None) -> Callable[..., tuple[torch.Tensor, ...]]:
    """A C++ wrapper's entry, `entry(inputs, outputs) -> status` (kiln/codegen/cpp_wrapper.py), as
    `call(*tensors) -> tuple of tensors`: each input handed over as a new handle (the wrapper
    releases it), the outputs taken back from those it made; a failure raised with `error()`'s
    message (IndexError for a kernel's index check). `entry` and `error` are ctypes functions of
    loaded libraries; `runtime`, the library of kiln's runtime the wrapper calls (kiln_runtime.cpp):
    the extension makes and releases the handles with its kiln_share and kiln_release, from the
    blocks it keeps for them (None: with operator new and delete).

    In-process graphs go through the extension (`build`: built if missing). `kiln.load` passes
    `build=False`: a deployed artifact runs without compiling anything, through the extension
    when the cache has it, else through ctypes and torch's own converters (~0.4 µs a tensor more)."""
    door = module() if build else built_module()
    if door is not None:
        address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
        if runtime is None:
            return door.GraphCall(address(entry), address(error), num_outputs)
        return door.GraphCall(address(entry), address(error), num_outputs,
                              address(runtime.kiln_share), address(runtime.kiln_release))
    return _ctypes_graph_call(entry, error, num_outputs)


def bind_trailing(call: Callable[..., tuple], tail: Sequence[torch.Tensor]) -> Callable[..., tuple]:
    """`lambda *head: call(*head, *tail)`: for the extension's graph call, the same entry with `tail`
    held in C++ (`GraphCall.bind`), so that a call neither passes those tensors through Python nor
    converts them (a decode step's ~490 constants: 0.965x the time a token of a 24-layer twin whose
    step is all host work)."""
    tail = tuple(tail)
    if _module.cache_info().currsize and type(call) is module().GraphCall and all(isinstance(t, torch.Tensor) for t in tail):
        return call.bind(tail)
    return lambda *head: call(*head, *tail)


def _ctypes_graph_call(entry: Any, error: Any, num_outputs: int) -> Callable[..., tuple[torch.Tensor, ...]]:
    from kiln.native.libkiln import handles_of, tensors_of

    entry.argtypes, entry.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    error.restype = ctypes.c_char_p
    outputs_type = ctypes.c_void_p * num_outputs

    def call(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        handles = handles_of(tensors)
        outputs = outputs_type()
        status = entry((ctypes.c_void_p * len(handles))(*handles), outputs)
        if status:
            raise (IndexError if status == 2 else RuntimeError)(error().decode())
        return tuple(tensors_of(outputs))

    return call


def tensor_check() -> Callable[..., Callable[[Any], bool]] | None:
    """The extension's `TensorCheck(type, dtype, device, dim, sizes, strides, requires_grad,
    storage_offset=None)` (None in sizes or strides: that one not checked), a guard's tensor match
    as one C call, when this process has loaded the extension (C++ wrapper
    graphs load it before their guards are compiled); None otherwise: guards then check in Python."""
    return module().TensorCheck if _module.cache_info().currsize else None


def alias_pattern_function() -> Callable[[Sequence[Any], bool], tuple[int, ...]] | None:
    """The extension's `alias_pattern(values, by_storage)` (kiln/capture/guards.py's in one C loop)
    when this process has loaded it; None otherwise: the guards call Python's."""
    return module().alias_pattern if _module.cache_info().currsize else None


def watch() -> Any:
    """A new `Watch` of the extension (the guards' stable part, kiln/capture/guards.py) when this
    process has it or the C++ cache holds it (loaded then; nothing is built) and its Python
    versions dicts; None otherwise: every guard is then checked on every call."""
    extension = built_module()
    return extension.Watch() if extension is not None and extension.dict_versions else None


def greedy_tokens_function() -> Callable[..., torch.Tensor | None] | None:
    """The extension's `greedy_tokens(logits, column=False)` (torch.argmax(logits, -1) of a CPU
    float32 matrix in two vectorized passes, as a [batch, 1] column where asked; None for other
    tensors) when this process has loaded the extension (a compiled C++ wrapper graph loads it);
    None otherwise."""
    return module().greedy_tokens if _module.cache_info().currsize else None


def successor_function() -> Callable[[torch.Tensor], torch.Tensor | None] | None:
    """The extension's `successor(t)` (t + 1 of a small contiguous CPU int64 tensor, without the
    dispatcher; None for other tensors) when this process has loaded the extension; None otherwise."""
    return module().successor if _module.cache_info().currsize else None


def _python_views(bases: Sequence[torch.Tensor], size: Sequence[int], stride: Sequence[int], offset: int) -> list[torch.Tensor]:
    return [base.as_strided(size, stride, offset) for base in bases]


def views_function() -> Callable[[Sequence[torch.Tensor], Sequence[int], Sequence[int], int], list[torch.Tensor] | None]:
    """`views(bases, size, stride, offset)`: each base's `as_strided` view of that layout. The
    extension's (one C loop; None where a base is a tensor subclass) when this process has loaded
    it, otherwise Python's."""
    return module().views_of if _module.cache_info().currsize else _python_views


def _python_stamp(tensors: list[torch.Tensor], expected: Any = None) -> list[tuple[int, int, int]] | bool:
    stamp = [(id(t), t._version, t.data_ptr()) for t in tensors]
    return stamp if expected is None else stamp == expected


def stamp_function() -> Callable[..., Any]:
    """`stamp(tensors)`: what changes when a tensor is replaced, written in place or rebound to
    other memory (callers keep the tensors alive, so identities are not reused);
    `stamp(tensors, expected)`: whether that is `expected` (a stamp it gave). The extension's
    (one C loop, ~10 ns a tensor) when this process has it — it is built for C++ wrappers —
    otherwise the same check in Python (~0.2 µs a tensor), so that a process without C++ wrappers
    never waits for the extension to build."""
    return module().stamp if _module.cache_info().currsize else _python_stamp
