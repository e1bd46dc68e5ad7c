"""One GPU timing at a time: an exclusive `flock` on a file that every case of a run shares.

With `kiln bench --jobs N` several cases run at once, each in its own process; on a GPU their
timing phases take turns under this lock, so that no two processes' timed calls share the GPU,
while the others go on compiling. The file is the setting `bench.timing_lock`
(`KILN_BENCH_TIMING_LOCK`, which carries it to the cases' processes): the runner makes one for a
run, or keeps the caller's, so that several `kiln bench` runs and other GPU work can share one
lock (benchmarks/tools/gpu_check.sh runs tests/gpu so):

    KILN_BENCH_TIMING_LOCK=PATH python -m benchmarks.timing_lock COMMAND ARGS...   # COMMAND holding the lock
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import sys
import time
from typing import Iterator

from kiln import config

ENV = "KILN_BENCH_TIMING_LOCK"  # bench.timing_lock's variable


@contextlib.contextmanager
def held(path: str | None) -> Iterator[float | None]:
    """Hold the lock on `path` for the body; yields the seconds spent waiting for it (None, and no
    lock, when `path` is None). The lock goes with the process, should it die holding it."""
    if path is None:
        yield None
        return
    with open(path, "a") as file:
        start = time.perf_counter()
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield time.perf_counter() - start
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def configured() -> str | None:
    """The lock file of this process's settings, None when there is none."""
    return config.bench.timing_lock or None


def main(argv: list[str]) -> int:
    if not argv or configured() is None:
        print(f"usage: {ENV}=PATH python -m benchmarks.timing_lock COMMAND ARGS...", file=sys.stderr)
        return 2
    with held(configured()):
        return subprocess.call(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
