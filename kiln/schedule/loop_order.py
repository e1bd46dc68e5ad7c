"""Loop order of pointwise nodes: the dim most accesses walk contiguously goes innermost, where
the vector loop runs. Reductions keep their order (their reduction loop is innermost)."""

from __future__ import annotations

from kiln.ir.nodes import Buffer, Pointwise
from kiln.schedule.index_bounds import linear_stride
from kiln.schedule.loop_nest import LoopNest, loop_nest


def _unit_stride_counts(nest: LoopNest) -> list[int]:
    accesses = [index for _, index in nest.reads] + [nest.store_index]
    return [sum(1 for a in accesses if linear_stride(a, v) == 1) for v in nest.node.index_vars()]


def ordered_nest(buffer: Buffer, node) -> LoopNest:
    """The node's loop nest, pointwise dims reordered when another dim beats the last one."""
    nest = loop_nest(buffer, node)
    if not isinstance(node, Pointwise) or len(nest.ranges) < 2:
        return nest
    counts = _unit_stride_counts(nest)
    best = max(range(len(counts)), key=lambda d: (counts[d], d))
    if counts[best] <= counts[-1]:
        return nest
    order = [d for d in range(len(counts)) if d != best] + [best]
    return loop_nest(buffer, node, order)
