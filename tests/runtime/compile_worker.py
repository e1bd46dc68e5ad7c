"""One process of tests/runtime/test_concurrent.py: build the small model, wait at a barrier for
its peers, compile and run it with kiln's default settings, and save what it saw.

    python -m tests.runtime.compile_worker BARRIER_DIR PEERS OUT

The barrier is a folder: each worker writes `ready.<pid>` into it and waits until `PEERS` such
files exist, so all start compiling within a millisecond or so of each other. `KILN_CACHE_DIR`
(the environment) is the cache they share.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import torch

import kiln
from kiln.autotune.choose import COUNTS
from kiln.runtime import fallback
from tests.runtime.soak import Mlp


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _barrier(folder: str, peers: int, timeout_s: float = 120.0) -> None:
    open(os.path.join(folder, f"ready.{os.getpid()}"), "w").close()
    deadline = time.monotonic() + timeout_s
    while sum(name.startswith("ready.") for name in os.listdir(folder)) < peers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only some of {peers} workers reached the barrier")
        time.sleep(0.001)


def main(barrier: str, peers: int, out: str) -> None:
    torch.manual_seed(0)
    model = Mlp(64).eval()
    x = torch.randn(16, 64)
    kiln.config.debug.logs = ("cache",)  # what came from the cache, what was built
    collect = _Collect()
    logging.getLogger("kiln").addHandler(collect)
    logging.getLogger("kiln").propagate = False
    compiled = kiln.compile(model)
    _barrier(barrier, peers)
    with torch.no_grad():
        out_compiled, out_eager = compiled(x), model(x)
    torch.save({"compiled": out_compiled, "eager": out_eager, "fallbacks": [str(f) for f in fallback.FALLBACKS],
                "measured": COUNTS["measured"], "log": collect.lines}, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
