"""When a pointwise value becomes a buffer instead of being inlined into its consumers.

Inlining a value into each consumer fuses for free, but a value read by several consumers (or
twice by one, as `x * x`) is recomputed by each, and chains of such values grow exponentially:
a backward graph's body can reach thousands of ops, which slows both lowering and the C++
compiler. A value used more than once whose body costs more than a few ops is realized; the
scheduler still fuses its loop with its consumers', so it costs one store and loads of a buffer.
So is a value used more than once that gathers: one that reads memory across its rows (ViT's
patch embeddings, a transposed convolution output, feed every layer norm and residual add of the
first block), so that each reader would gather it lane by lane; realized, it is gathered once and
read contiguously after.
"""

from __future__ import annotations

from typing import Any

from torch import fx
from torch.utils import _pytree as pytree

from kiln.ir.analysis import OpCounter, ReadsWrites
from kiln.ir.nodes import index_symbols
from kiln.ir.ops import use_handler
from kiln.lowering.values import TensorValue
from kiln.schedule.index_bounds import linear_stride, simplify

MAX_INLINED_OPS = 8  # body ops a value may have and still be recomputed by each of its readers
_FREE = ("load", "constant", "index_expr")


def uses(node: fx.Node) -> int:
    """How many times later nodes read `node` (a node taking it twice counts twice)."""
    return sum(sum(1 for a in pytree.tree_leaves((u.args, u.kwargs)) if a is node) for u in node.users)


def body_cost(value: TensorValue) -> int:
    """Ops in one element of `value`, loads and constants not counted."""
    with use_handler(OpCounter()) as counter:
        value.loader(index_symbols("i", value.rank))
    return sum(n for op, n in counter.counts.items() if op not in _FREE)


def gathers(value: TensorValue) -> bool:
    """Does `value` load memory with a stride other than 0 or 1 along its last dim?"""
    if value.rank == 0:
        return False
    index = index_symbols("i", value.rank)
    with use_handler(ReadsWrites()) as reads:
        value.loader(index)
    extents = dict(zip(index, value.size))
    return any(linear_stride(simplify(at, extents), index[-1]) not in (0, 1) for _, at in reads.reads)


def should_realize(node: fx.Node, value: Any) -> bool:
    if not isinstance(value, TensorValue) or value.buffer is not None or value.strided is not None:
        return False  # buffers and views of buffers cost nothing to read again
    return uses(node) > 1 and (body_cost(value) > MAX_INLINED_OPS or gathers(value))
