"""The order of a round of interleaved timings (kiln bench's workers, the gemm and llm suites,
benchmarks/tools/quant_decode_sweep.py): each round starts at the next item, so that none always
runs first — the first of a round ran slower on these VMs (2026-12-05, an Intel Xeon with AMX:
three builds of one source, always in one order, took 0.975x and 0.970x the first's time) — or
always on the caches one other left."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def rotated(items: list[T], r: int) -> list[T]:
    """`items` starting at the r-th (modulo their count)."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]
