"""Fusion: compute nodes grouped into kernels that share outer loops.

A `FusedKernel` (kiln/ir/schedule.py) runs its outer loops once; inside, each member runs its own inner loops in order
(a reduction's reduction loop, a pointwise node's remaining dims). So softmax is one kernel: per
row, a max loop, a sum loop and a write loop; a layer norm's statistics and normalization, or a
residual add followed by a layer norm, likewise. Nodes join a kernel when

- their loops fit: a reduction's output ranges equal the kernel's outer ranges; a pointwise
  node's ranges start with them (a kernel of pointwise nodes only shrinks its outer ranges to a
  reduction's when one joins);
- every read of a buffer written inside the kernel reads what was written in the same outer
  iteration (same outer index; for rows written by an inner loop, inside that row);
- everything else they read is computed before the kernel's position (a kernel runs where its
  first member was, so members may move earlier past unrelated externs).

A member with no inner loops whose result nobody outside the kernel reads (a row's max or sum) is
kept in a local variable instead of memory.
"""

from __future__ import annotations

import sympy

from kiln.ir.index_bounds import is_nonnegative, max_value
from kiln.ir.schedule import FusedKernel, LoopNest, loop_extents


def _outer_vars(count: int) -> list[sympy.Symbol]:
    return [sympy.Symbol(f"i{d}", integer=True, nonnegative=True) for d in range(count)]


def _reads_same_row(read: sympy.Expr, reader_extents: dict, producer: LoopNest, outer: int) -> bool:
    """Does `read` (over the reader's loop variables, whose first `outer` are the kernel's outer
    ones, with `reader_extents`) address the element, or the row, that `producer` stores in the
    same outer iteration?"""
    pinner = list(producer.node.index_vars())[outer:]
    at_row = producer.store_index.subs({v: 0 for v in pinner})
    rest = sympy.expand(read - at_row)
    if any(v in rest.free_symbols for v in _outer_vars(outer)):
        return False
    if not pinner:
        return rest == 0
    row_max = max_value(producer.store_index - at_row, dict(zip(pinner, producer.ranges[outer:])))
    rest_max = max_value(rest, reader_extents)  # None for indirect indices: no bound
    return row_max is not None and rest_max is not None and is_nonnegative(rest) and rest_max <= row_max


class KernelBuilder:
    """Accumulates members of one kernel; `accepts` decides whether a node may join."""

    def __init__(self, name: str, first: LoopNest, position: int) -> None:
        self.kernel = FusedKernel(name, tuple(first.ranges), [first])
        self.position = position

    def _outer_for(self, nest: LoopNest) -> tuple[sympy.Expr, ...] | None:
        outer, has_reduction = self.kernel.outer, any(m.is_reduction for m in self.kernel.members)
        ranges = tuple(nest.ranges)
        if nest.is_reduction:
            if ranges == outer:
                return outer
            shrinkable = not has_reduction and outer[: len(ranges)] == ranges
            return ranges if shrinkable else None
        if ranges[: len(outer)] == outer:
            return outer
        if not has_reduction and outer[: len(ranges)] == ranges:
            return ranges
        return None

    def _legal(self, members: list[LoopNest], outer: int) -> bool:
        written = {m.name: m for m in members}
        for k, m in enumerate(members):
            extents = loop_extents(m.node)
            for name, index in m.reads:
                producer = written.get(name)
                if producer is None:
                    continue
                if members.index(producer) >= k or not _reads_same_row(index, extents, producer, outer):
                    return False
        return True

    def accepts(self, nest: LoopNest) -> bool:
        # A scatter writes anywhere in its output, in no order another member could follow
        # (its value loaders inline their pointwise producers anyway): it is never fused.
        if nest.is_scatter or self.kernel.is_scatter:
            return False
        outer = self._outer_for(nest)
        if outer is None:
            return False
        members = self.kernel.members + [nest]
        if not self._legal(members, len(outer)):
            return False
        self.kernel.outer = outer
        self.kernel.members = members
        return True
