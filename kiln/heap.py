"""glibc's malloc asked, once per process and only where a setting says so, to keep the memory a
compiled call frees for the next call.

A compiled call allocates its large buffers (megabytes of activations) and frees them before it
returns. glibc's default policy is adaptive: blocks above a threshold it raises as it sees them
freed are mapped fresh from the system, and free memory at the top of the heap beyond twice that
threshold is handed back at once. Whether the next call then finds its memory resident depends on
where small allocations happen to sit between the large ones, which differs from process to
process: of five processes running MobileNetV1 under kiln on a 2-core AMD EPYC, three took 13.1-13.6
ms a call and two 17-18 ms, paying 1,400-2,300 page faults a call (each buffer's pages touched
for the first time again). Inductor's allocation order happened to escape it there; nothing in
either design prevents it.

kiln can fix the two thresholds (`mallopt`) where the user asks for it with
`runtime.keep_freed_mb` (`KILN_KEEP_FREED_MB`): allocations below 32 MiB then come from the heap
(glibc's own ceiling for its adaptive threshold), and up to that many MiB of free heap stays with
the process instead of going back to the system. With 256, five processes of five ran at 13.1-14.5
ms and none faulted. It is off by default (0): the thresholds are the whole process's, so they
also change the speed and memory of everything else it runs, eager code included, and a process
that compiled with kiln would not be comparable with one that did not. Set, they are fixed once,
by the first compiled graph (or by `kiln bench` at a case's start, for every mode alike); the cost
is memory: a process keeps up to that much freed heap resident after its calls, where glibc alone
would have returned most of it.

Left alone even when asked: where the user set glibc's own knobs (`MALLOC_TRIM_THRESHOLD_`,
`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TOP_PAD_`, `GLIBC_TUNABLES`), and where the C library is not
glibc. An allocator preloaded in glibc's place (jemalloc, tcmalloc) keeps its own policy; glibc's
knobs then govern nothing. What was decided is kept (`decision()`, `MALLOPT_CALLS`) and said by
`describe()`, which `kiln.explain` and `kiln bench` print.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

from kiln import config, logs

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_HEAP_BELOW = 32 << 20  # glibc's ceiling for its adaptive mmap threshold on 64-bit machines
_USERS_KNOBS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


@dataclass(frozen=True)
class Decision:
    """What this process did with glibc's thresholds."""

    applied: bool
    keep_mb: int  # runtime.keep_freed_mb when it was decided
    why: str  # "set", or why they were left alone


_decision: Decision | None = None  # None: not decided yet in this process
MALLOPT_CALLS: list[tuple[int, int]] = []  # every (parameter, value) kiln passed to mallopt in this process


def _glibc_mallopt():
    """glibc's `mallopt`, or None where the C library is another."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Fix glibc's thresholds as above when `runtime.keep_freed_mb` asks for it, on the first call
    in a process; whether they are set."""
    global _decision
    if _decision is not None:
        return _decision.applied
    keep_mb = config.runtime.keep_freed_mb
    if keep_mb <= 0:
        _decision = Decision(False, keep_mb, "off")
    else:
        _decision = _apply(keep_mb)
    logs.log("runtime", "%s", describe())
    return _decision.applied


def _apply(keep_mb: int) -> Decision:
    mallopt = _glibc_mallopt()
    users = [k for k in _USERS_KNOBS if k in os.environ]
    if mallopt is None:
        return Decision(False, keep_mb, "the C library is not glibc")
    if users:
        return Decision(False, keep_mb, f"the user set {', '.join(users)}")
    for parameter, value in ((_M_MMAP_THRESHOLD, _HEAP_BELOW), (_M_TRIM_THRESHOLD, keep_mb << 20)):
        MALLOPT_CALLS.append((parameter, value))
        if not mallopt(parameter, value):
            return Decision(False, keep_mb, f"mallopt refused {value} for parameter {parameter}")
    return Decision(True, keep_mb, "set")


def decision() -> Decision | None:
    """What this process did with malloc's thresholds; None before the first compiled graph."""
    return _decision


def describe() -> str:
    """One line on glibc's malloc in this process, for `kiln.explain` and `kiln bench`.

        describe()  # "left alone (runtime.keep_freed_mb = 0, the default; KILN_KEEP_FREED_MB sets it)"
    """
    done = _decision
    keep_mb = config.runtime.keep_freed_mb if done is None else done.keep_mb
    setting = f"runtime.keep_freed_mb = {keep_mb}"
    if done is not None and done.applied:
        line = (f"kiln set glibc's thresholds for this process: blocks below {_HEAP_BELOW >> 20} MiB from the heap, "
                f"up to {keep_mb} MiB of freed heap kept ({setting})")
    elif keep_mb <= 0:
        line = f"left alone ({setting}, the default; KILN_KEEP_FREED_MB sets it)"
    elif done is None:
        line = (f"not changed yet: the first compiled graph keeps up to {keep_mb} MiB of freed heap for this "
                f"process ({setting})")
    else:
        line = f"left alone although asked for ({setting}): {done.why}"
    if done is not None and config.runtime.keep_freed_mb != done.keep_mb:
        line += f"; decided once per process, so the setting's later value {config.runtime.keep_freed_mb} does not apply"
    return line
