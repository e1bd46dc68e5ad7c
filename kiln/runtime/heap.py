"""glibc's malloc asked, once per process, to keep the memory a compiled call frees for the next call.

A compiled call allocates its large buffers (megabytes of activations) and frees them before it
returns. glibc's default policy is adaptive: blocks above a threshold it raises as it sees them
freed are mapped fresh from the system, and free memory at the top of the heap beyond twice that
threshold is handed back at once. Whether the next call then finds its memory resident depends on
where small allocations happen to sit between the large ones, which differs from process to
process: of five processes running MobileNetV1 under kiln on a 2-core AMD EPYC, three took 13.1-13.6
ms a call and two 17-18 ms, paying 1,400-2,300 page faults a call (each buffer's pages touched
for the first time again). Inductor's allocation order happened to escape it there; nothing in
either design prevents it.

So the first compiled graph of a process fixes the two thresholds (`mallopt`): allocations below
32 MiB come from the heap (glibc's own ceiling for its adaptive threshold), and up to
`runtime.keep_freed_mb` MiB (default 256) of free heap stays with the process instead of going
back to the system. With them, five processes of five ran at 13.1-14.5 ms and none faulted. The
cost is memory: a process keeps up to that much freed heap resident after its calls, where
glibc alone would have returned most of it.

Left alone: where `runtime.keep_freed_mb` is 0 (`KILN_KEEP_FREED_MB=0`), where the user set glibc's
own knobs (`MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TOP_PAD_`, `GLIBC_TUNABLES`),
and where the C library is not glibc. An allocator preloaded in glibc's place (jemalloc, tcmalloc)
keeps its own policy; glibc's knobs then govern nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

from kiln import config, logs

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_HEAP_BELOW = 32 << 20  # glibc's ceiling for its adaptive mmap threshold on 64-bit machines
_USERS_KNOBS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

_applied: bool | None = None  # None: not decided yet in this process


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
    """Fix glibc's thresholds as above, on the first call in a process; whether they are set."""
    global _applied
    if _applied is not None:
        return _applied
    keep_mb = config.runtime.keep_freed_mb
    mallopt = _glibc_mallopt()
    users = [k for k in _USERS_KNOBS if k in os.environ]
    if keep_mb <= 0 or mallopt is None or users:
        why = "off" if keep_mb <= 0 else "not glibc" if mallopt is None else f"the user set {', '.join(users)}"
        logs.log("runtime", "malloc thresholds left alone: %s", why)
        _applied = False
        return False
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, _HEAP_BELOW)) and bool(mallopt(_M_TRIM_THRESHOLD, keep_mb << 20))
    logs.log("runtime", "malloc: heap below %d MiB, up to %d MiB of freed heap kept (%s)",
             _HEAP_BELOW >> 20, keep_mb, "set" if _applied else "refused")
    return _applied
