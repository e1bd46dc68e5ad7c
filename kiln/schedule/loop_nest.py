"""A compute node made into a `LoopNest` (kiln/ir/schedule.py), as the scheduler sees it: its loops
with size-1 dims dropped, in a chosen order, and the flat index it stores to. Normalizing lets
nodes that differ only by `keepdim`-style unit dims share loops."""

from __future__ import annotations

from typing import Sequence

import sympy

from kiln.ir.analysis import ReadsWrites, run
from kiln.ir.index_bounds import simplify
from kiln.ir.nodes import Buffer, Node, Pointwise, Reduction, Scatter, index_symbols
from kiln.ir.schedule import LoopNest, loop_extents


def _expand(kept: Sequence[int], rank: int, index: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    full = [sympy.Integer(0)] * rank
    for d, i in zip(kept, index):
        full[d] = i
    return full


def _non_unit(sizes: Sequence[sympy.Expr]) -> list[int]:
    return [d for d, s in enumerate(sizes) if s != 1]


def loop_nest(buffer: Buffer, node: Node, order: Sequence[int] | None = None) -> LoopNest:
    """`node` (computing `buffer`) normalized; `order` permutes its non-unit output dims
    (outermost first), for pointwise nodes whose loop order the scheduler chooses."""
    if isinstance(node, Scatter):
        return _scatter_nest(buffer, node)
    rank = len(node.ranges)
    kept = _non_unit(node.ranges)
    if order is not None:
        kept = [kept[k] for k in order]
    ranges = [node.ranges[d] for d in kept]
    if isinstance(node, Reduction):
        rrank = len(node.reduction_ranges)
        rkept = _non_unit(node.reduction_ranges) or [0]
        new: Node = Reduction(
            node.dtype, ranges, [node.reduction_ranges[d] for d in rkept], node.reduction_type,
            lambda idx, ridx: node.inner_fn(_expand(kept, rank, idx), _expand(rkept, rrank, ridx)),
            name=node.name, src_dtype=node.src_dtype,
        )
    else:
        new = Pointwise(node.dtype, ranges, lambda idx: node.inner_fn(_expand(kept, rank, idx)), name=node.name)
    layout = buffer.layout
    store = layout.flat_index(_expand(kept, rank, index_symbols("i", len(ranges)))) - layout.offset
    extents = loop_extents(new)
    reads = [(name, simplify(index, extents)) for name, index in run(ReadsWrites(), new).reads]
    return LoopNest(buffer, new, simplify(sympy.expand(store), extents), reads)


def _scatter_nest(buffer: Buffer, node: Scatter) -> LoopNest:
    """A scatter as it is: it runs alone in its kernel (never fused), so its loops need no
    normalizing; `store_index` is where its initial values go."""
    extents = loop_extents(node)
    store = buffer.layout.flat_index(node.index_vars()) - buffer.layout.offset
    reads = [(name, simplify(index, extents)) for name, index in run(ReadsWrites(), node).reads]
    return LoopNest(buffer, node, simplify(sympy.expand(store), extents), reads)


