"""When a pointwise value becomes a buffer instead of being inlined into its consumers.

Inlining a value into each consumer fuses for free, but a value read by several consumers (or
twice by one, as `x * x`) is recomputed by each, and chains of such values grow exponentially:
a backward graph's body can reach thousands of ops, which slows both lowering and the C++
compiler. A value used more than once whose body costs more than a few ops is realized; the
scheduler still fuses its loop with its consumers', so it costs one store and loads of a buffer.
So is a value used more than once that gathers: one that reads memory across its rows (ViT's
patch embeddings, a transposed convolution output, feed every layer norm and residual add of the
first block), so that each reader would gather it lane by lane; realized, it is gathered once and
read contiguously after. And so is a value with costly math that readers broadcast along outer
loops (Llama's rotary cos and sin, read by every head): inlined, each element would be computed
again for every head.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.ir.analysis import OpCounter, ReadsWrites
from kiln.ir.index_bounds import linear_stride, simplify
from kiln.ir.nodes import index_symbols
from kiln.ir.ops import use_handler
from kiln.lowering.extern_layouts import returns_view
from kiln.lowering.values import TensorValue

MAX_INLINED_OPS = 8  # body ops a value may have and still be recomputed by each of its readers
MIN_RECOMPUTED = 16384  # elements broadcasting readers may recompute before a costly value is stored
_FREE = ("load", "constant", "index_expr")
# Costly enough that a broadcasting reader should not recompute them for each of its elements.
_MATH = {"exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid", "erf", "erfc",
         "pow", "atan", "atan2", "asin", "acos", "sinh", "cosh", "exp2", "log2", "log10", "truediv"}


def uses(node: fx.Node) -> int:
    """How many times later nodes read `node` (a node taking it twice counts twice)."""
    return sum(sum(1 for a in pytree.tree_leaves((u.args, u.kwargs)) if a is node) for u in node.users)


def _op_counts(value: TensorValue) -> dict[str, int]:
    with use_handler(OpCounter()) as counter:
        value.loader(index_symbols("i", value.rank))
    return counter.counts


def body_cost(value: TensorValue) -> int:
    """Ops in one element of `value`, loads and constants not counted."""
    return sum(n for op, n in _op_counts(value).items() if op not in _FREE)


def has_math(value: TensorValue) -> bool:
    """Does `value` compute a transcendental function or a division?"""
    return any(op in _MATH for op in _op_counts(value))


def _shape(node: fx.Node) -> list[int] | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or any(isinstance(d, torch.SymInt) for d in val.shape):
        return None
    return [int(d) for d in val.shape]


def _recomputed(read: list[int], reader: list[int]) -> int:
    """Times a reader of shape `reader` recomputes each element of an inlined value it reads
    broadcast from shape `read`, beyond the first. Only dims left of the value's last varying
    one count: the C++ compiler hoists what does not vary along the loops inside it (a batch
    norm's per-channel scale over H and W), not what an outer loop repeats (Llama's rotary
    tables over the heads)."""
    read = [1] * (len(reader) - len(read)) + read
    varying = [d for d, n in enumerate(read) if n != 1]
    inner = varying[-1] if varying else len(read)
    repeats = 1
    for d in range(inner):
        if read[d] == 1:
            repeats *= reader[d]
    return repeats - 1


def recomputed_elements(node: fx.Node) -> int:
    """Elements of `node` its readers (looked through views) would compute again if inlined."""
    shape = _shape(node)
    if not shape:
        return 0
    numel, total = math.prod(shape), 0
    pending = [(user, shape) for user in node.users]
    while pending:
        user, read = pending.pop()
        reader = _shape(user)
        if user.op != "call_function" or reader is None or len(reader) < len(read):
            continue
        if returns_view(user.target) and math.prod(reader) == math.prod(read):
            pending.extend((u, reader) for u in user.users)  # a reshape or permute: same elements
        else:
            total += numel * _recomputed(read, reader)
    return total


def gathers(value: TensorValue) -> bool:
    """Does `value` load memory with a stride other than 0 or 1 along its last dim?"""
    if value.rank == 0:
        return False
    index = index_symbols("i", value.rank)
    with use_handler(ReadsWrites()) as reads:
        value.loader(index)
    extents = dict(zip(index, value.size))
    return any(linear_stride(simplify(at, extents), index[-1]) not in (0, 1) for _, at in reads.reads)


def costly_to_read_again(value: TensorValue) -> bool:
    """Would each further reader of `value` pay too much to compute it again: a body of more than a
    few ops, or loads that gather across its rows? (A lowering that reads its input in several
    passes, as softmax does, asks this of the input too.)"""
    if value.buffer is not None or value.strided is not None:
        return False  # buffers and views of buffers cost nothing to read again
    return body_cost(value) > MAX_INLINED_OPS or gathers(value)


def should_realize(node: fx.Node, value: Any) -> bool:
    if not isinstance(value, TensorValue) or value.buffer is not None or value.strided is not None:
        return False  # buffers and views of buffers cost nothing to read again
    if uses(node) > 1 and costly_to_read_again(value):
        return True
    return recomputed_elements(node) >= MIN_RECOMPUTED and has_math(value)
