"""Reductions over some dims: one `Reduction` node each (mean is its sum divided by the count)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import sympy
import torch

from kiln.ir.nodes import Reduction
from kiln.lowering.pointwise import pointwise
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue

aten = torch.ops.aten


@dataclass
class ReductionResult:
    """What a reduction lowering returns: the node to realize, the size eager gives its result
    (keepdim), and an optional pointwise step on the realized result (mean's division)."""

    node: Reduction
    size: list[sympy.Expr]
    then: Callable[[TensorValue], TensorValue] | None = None


def reduce(kind: str, x: TensorValue, dims: Sequence[int] | None, keepdim: bool, dtype: torch.dtype | None = None) -> ReductionResult:
    """A `Reduction` of `x` over `dims` (all when empty), as eager's `op(x, dims, keepdim)`."""
    dims = sorted({d + x.rank if d < 0 else d for d in (dims if dims else range(x.rank))})
    kept = [d for d in range(x.rank) if d not in dims]
    out_dtype = dtype or (torch.int64 if kind in ("sum", "prod") and not x.dtype.is_floating_point and x.dtype != torch.bool else x.dtype)

    def inner_fn(index, rindex):
        full = [None] * x.rank
        for d, i in zip(kept, index):
            full[d] = i
        for d, r in zip(dims, rindex):
            full[d] = r
        return x.loader(full)

    node = Reduction(out_dtype, [x.size[d] for d in kept], [x.size[d] for d in dims], kind, inner_fn)
    size = [sympy.Integer(1) if d in dims else x.size[d] for d in range(x.rank)] if keepdim else list(node.ranges)
    return ReductionResult(node, size)


@register_lowering(aten.sum.dim_IntList)
def sum_(x: TensorValue, dims: Sequence[int] | None = None, keepdim: bool = False, *, dtype=None):
    return reduce("sum", x, dims, keepdim, dtype)


@register_lowering(aten.amax.default)
def amax(x: TensorValue, dims: Sequence[int] = (), keepdim: bool = False):
    return reduce("max", x, dims, keepdim)


@register_lowering(aten.amin.default)
def amin(x: TensorValue, dims: Sequence[int] = (), keepdim: bool = False):
    return reduce("min", x, dims, keepdim)


@register_lowering(aten.mean.dim)
def mean(x: TensorValue, dims: Sequence[int] | None = None, keepdim: bool = False, *, dtype=None):
    result = reduce("sum", x, dims, keepdim, dtype)
    count = sympy.Mul(*result.node.reduction_ranges)
    if not count.is_Integer:
        raise NotImplementedError("mean over a symbolic count")  # becomes an extern call
    result.then = lambda total: pointwise("truediv", [total, int(count)])
    return result
