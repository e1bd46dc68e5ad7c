"""Writes to frozen tensors that their version counter does not show.

A frozen program (kiln/runtime/frozen.py) keeps its constants valid with a per-call check on each
frozen input: the same tensor object, at the same version counter, on the same memory. The version
counter moves on every in-place write made through the tensor or a view of it (`w.add_(d)`, an
optimizer step, `load_state_dict`), and the memory check sees a rebinding (`w.data = new`,
`module.to(...)`). One common write gets past both: **in place through `.data`**
(`w.data.copy_(new)`, `w.data += delta`, `w.data.mul_(decay).add_(...)`), because `.data` returns
a new tensor with a version counter of its own.

This module closes that gap for parameters. Once a frozen program holds a parameter, reading its
`.data` hands out the usual tensor `d` and keeps a *handle*: `d.detach()`, which shares `d`'s
version counter (so it sees writes through `d` and every view of `d`), and a weak reference to `d`.
`sweep()`, at the start of each frozen call, compares each handle's counter with what it last saw,
marks its parameter written, and drops the handles whose `d` is gone (PyTorch keeps `d`'s Python
object alive while a view of it lives, so a dropped handle has no writer left). Reading `.data`
without writing costs no refreeze; a parameter nobody froze pays one dictionary lookup per `.data`.

The hook is a `data` property on `torch.nn.Parameter` installed by the first `watch()`; it returns
exactly what `.data` returned before (same tensor, same version counter, same autograd behaviour).

What it cannot see (docs/freezing.md; `kiln.refreeze(model)` is the remedy): writes through
`.data` of a *buffer* (buffers are plain tensors), through a `.data` tensor taken before the first
compiled call, through `.detach()` of a `.data` tensor kept after the `.data` tensor itself is
gone, and writes outside PyTorch (NumPy views, DLPack, `data_ptr()`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterable

import torch

_WATCH = "_kiln_data_watch"  # attribute in a watched tensor's __dict__
_TENSOR_DATA = torch._C.TensorBase.data  # the C getter/setter the property wraps


class Watch:
    """Per watched tensor: the epoch of the last write kiln saw that its version counter missed."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = 0


class _Handle:
    __slots__ = ("watch", "data", "counter", "seen")

    def __init__(self, watch: Watch, data: torch.Tensor) -> None:
        self.watch, self.data = watch, weakref.ref(data)
        self.counter = data.detach()  # shares data's version counter, holds no reference to data
        self.seen = self.counter._version


_handles: list[_Handle] = []
_lock = threading.Lock()
_PRUNE_FLOOR = 1024
_prune_at = _PRUNE_FLOOR  # handles kept before the getter sweeps by itself (code that reads `.data` in a loop, no call)
_epoch = 0  # bumped for every write seen; a frozen program remembers the epoch it last checked at
_installed = False


def _data_get(self: torch.Tensor) -> torch.Tensor:
    data = _TENSOR_DATA.__get__(self)
    watch = self.__dict__.get(_WATCH)
    if watch is not None:
        with _lock:
            _handles.append(_Handle(watch, data))
            if len(_handles) > _prune_at:
                _sweep_locked()
    return data


def _data_set(self: torch.Tensor, value: torch.Tensor) -> None:
    _TENSOR_DATA.__set__(self, value)
    watch = self.__dict__.get(_WATCH)
    if watch is not None:  # the memory check sees it too; marking it keeps the two independent
        mark_written([self])


def _install() -> None:
    global _installed
    if not _installed:
        torch.nn.Parameter.data = property(_data_get, _data_set, doc=_TENSOR_DATA.__doc__)
        _installed = True


def watch(tensors: Iterable[torch.Tensor]) -> None:
    """Keep track of writes through `.data` to these tensors (parameters; others are only marked
    by `mark_written`)."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and _WATCH not in t.__dict__:
            t.__dict__[_WATCH] = Watch()
            if isinstance(t, torch.nn.Parameter):
                _install()


def mark_written(tensors: Iterable[torch.Tensor]) -> None:
    """Record a write to these tensors (kiln.refreeze, a rebinding): frozen programs holding them
    compute their constants again on their next call."""
    global _epoch
    with _lock:
        for t in tensors:
            watch = t.__dict__.get(_WATCH) if isinstance(t, torch.Tensor) else None
            if watch is not None:
                _epoch += 1
                watch.written = _epoch


def sweep() -> int:
    """Look at every handle: mark the tensors written through `.data` since the last sweep, drop the
    handles nothing can write through any more. Returns the current epoch."""
    if not _handles:
        return _epoch
    with _lock:
        _sweep_locked()
        return _epoch


def _sweep_locked() -> None:
    global _epoch, _prune_at
    live = []
    for handle in _handles:
        version = handle.counter._version
        if version != handle.seen:
            handle.seen = version
            _epoch += 1
            handle.watch.written = _epoch
        if handle.data() is not None:
            live.append(handle)
    _handles[:] = live
    _prune_at = max(_PRUNE_FLOOR, 2 * len(live))


def written_since(tensors: Iterable[torch.Tensor], epoch: int) -> bool:
    """Whether any of these tensors was marked written after `epoch`."""
    for t in tensors:
        watch = t.__dict__.get(_WATCH)
        if watch is not None and watch.written > epoch:
            return True
    return False


def last_write(t: torch.Tensor) -> int:
    """The epoch of the last write marked on `t` (0: none), which its version counter may not show."""
    watch = t.__dict__.get(_WATCH)
    return watch.written if watch is not None else 0


def pending_handles() -> int:
    """Handles kept now (tests, kiln.explain): `.data` tensors of frozen parameters still alive."""
    return len(_handles)
