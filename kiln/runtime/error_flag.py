"""The index-error flag of a graph's Triton kernels, as the wrapper reads it (`index_error`).

Kernels with indirect indices (a gather, an embedding) clamp an index out of range, so memory
stays safe, and write 1 into a one-element int32 tensor; the wrapper reads it after the graph's
last kernel and raises IndexError (`IndexOutOfRange`), as eager does.

On the CPU (Triton's interpreter) the flag is read at once. On a GPU, reading it at once would wait
for every kernel of the call: the host could never queue the next call while the GPU works, and
each call would pay the GPU's idle gap. So each call queues a copy of the flag into host memory
without waiting, with an event behind it, and reads the copies of earlier calls whose events the
GPU has passed: an out-of-range index raises in a later call of the same graph, at most
`MAX_UNREAD` calls later (then the host waits for the oldest copy), much as eager's device-side
assertion surfaces at a later synchronization. The error names the call it came from.

While a CUDA graph is captured, nothing can be read or copied to pageable memory outside the
graph: the flags asked for are collected (`flags_read_later`) and read after each replay, by the
same deferred path.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Callable, Iterator

import torch

MAX_UNREAD = 2  # calls a GPU graph's flag reading may trail behind the host

_READ_LATER: list[list["ErrorFlag"]] = []  # open `flags_read_later` blocks, innermost last


class IndexOutOfRange(IndexError):
    """A kernel's index check found an index out of range: the inputs' fault, never kiln's, so a
    compiled graph's first call does not try ATen's graph on them (kiln/runtime/compiled_graph.py:
    on a GPU, ATen's indexing kernels assert on the device, which leaves the process's CUDA
    context unusable)."""


@contextlib.contextmanager
def flags_read_later() -> Iterator[list["ErrorFlag"]]:
    """While a CUDA graph is captured, a flag cannot be read (that would wait for the GPU): the
    flags the wrapper asks for in the block are collected in the list yielded, to be read by the
    caller after each replay (kiln/runtime/cuda_graphs.py)."""
    collected: list[ErrorFlag] = []
    _READ_LATER.append(collected)
    try:
        yield collected
    finally:
        _READ_LATER.remove(collected)


# Pinned host buffers whose copies have been read, reused by the next copies: every call of a
# GPU graph with indirect indices makes one, and a fresh pinned allocation costs more than a reuse.
_READ_BUFFERS: list[torch.Tensor] = []


class HostCopy:
    """The flag's value at one point of the GPU's stream, copied to pinned host memory without
    waiting for it."""

    def __init__(self, flag: torch.Tensor) -> None:
        self.host = _READ_BUFFERS.pop() if _READ_BUFFERS else torch.empty(1, dtype=torch.int32, pin_memory=True)
        self.host.copy_(flag, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()
        self.passed = False  # the GPU is known to have passed the event

    def ready(self) -> bool:
        self.passed = self.passed or self.event.query()
        return self.passed

    def read(self) -> int:
        # A passed event is not synchronized with (that is a wait to the profiler, and a driver
        # call): asked first, also where the caller reads the oldest copy without asking, being
        # `MAX_UNREAD` calls ahead.
        if not self.ready():
            self.event.synchronize()
        value = int(self.host[0])
        _READ_BUFFERS.append(self.host)  # (the copy into it is done: free for the next one)
        return value


class ErrorFlag:
    """The wrapper's `index_error` for Triton kernels: `.value` is nonzero when a kernel read an
    index out of range (on a GPU, in this call or an earlier one: see the module's docstring);
    setting it to 0 clears it."""

    def __init__(self, tensor: torch.Tensor, copy: Callable[[torch.Tensor], HostCopy] = HostCopy) -> None:
        self.tensor, self._copy = tensor, copy
        self.unread: deque[tuple[int, HostCopy]] = deque()  # (call number, its copy), oldest first
        self.calls = 0
        self.late_by = 0  # calls between the one that set the flag and the one reading it

    @property
    def value(self) -> int:
        if not self.tensor.is_cuda:
            return int(self.tensor.item())
        if _READ_LATER and torch.cuda.is_current_stream_capturing():
            if self not in _READ_LATER[-1]:
                _READ_LATER[-1].append(self)
            return 0
        return self._read_without_waiting()

    @value.setter
    def value(self, value: int) -> None:
        self.tensor.fill_(value)
        self.unread.clear()  # (copies queued before the clearing would report the same error again)

    def _read_without_waiting(self) -> int:
        self.calls += 1
        self.unread.append((self.calls, self._copy(self.tensor)))
        while self.unread and (len(self.unread) > MAX_UNREAD or self.unread[0][1].ready()):
            call, copy = self.unread.popleft()
            if copy.read():
                self.late_by = self.calls - call
                return 1
        return 0

    def check(self, where: str) -> None:
        """IndexError (and the flag cleared) when a kernel set it."""
        if self.value:
            self.value = 0
            raise IndexOutOfRange(f"index out of range in {where} (an indexing op read outside its input){self.when()}")

    def when(self) -> str:
        """Which call it was, where the reading trailed behind (a GPU's)."""
        if not self.late_by:
            return ""
        return f", {self.late_by} call{'s' if self.late_by > 1 else ''} before this one (the GPU's flag is read without waiting)"
