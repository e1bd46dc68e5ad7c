"""How long a candidate takes: the median of repeated runs after a warm-up, stopped early by a
time budget so a slow candidate (a 50,000-wide vocabulary projection) costs a few runs, not many."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(run: Callable[[], object], budget_s: float, min_runs: int = 2, max_runs: int = 25) -> float:
    run()  # warm-up: first-touch page faults, library dispatch caches, packing done on first call
    times: list[float] = []
    spent = 0.0
    while len(times) < max_runs and (len(times) < min_runs or spent < budget_s):
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
    return statistics.median(times)
