"""Loop order of pointwise nodes: the dim along which most memory is walked contiguously goes
innermost, where the vector loop runs. Reductions keep their order (their reduction loop is
innermost)."""

from __future__ import annotations

import math

import sympy

from kiln.ir.index_bounds import linear_stride
from kiln.ir.nodes import Buffer, Pointwise
from kiln.ir.schedule import LoopNest
from kiln.ir.sizes import typical
from kiln.schedule.loop_nest import loop_nest


def _footprint(index: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> int:
    """How many elements an access touches over the loops: the product of the ranges of the loop
    variables its index depends on. A batch norm's per-channel parameters (C elements) must not
    outvote the activations (N·C·H·W) it reads and writes."""
    return math.prod(ranges[v] for v in sympy.sympify(index).free_symbols if v in ranges)


def _unit_stride_counts(nest: LoopNest) -> list[int]:
    accesses = [index for _, index in nest.reads] + [nest.store_index]
    variables = nest.node.index_vars()
    ranges = {v: typical(r) for v, r in zip(variables, nest.node.ranges)}
    return [sum(_footprint(a, ranges) for a in accesses if linear_stride(a, v) == 1) for v in variables]


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
