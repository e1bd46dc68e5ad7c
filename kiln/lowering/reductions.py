"""Reductions over some dims: one `Reduction` node each (mean is its sum divided by the count).

A lowering returns a `ReductionResult`; the graph realizes it. Variance is the sum of squared
deviations from the mean (better conditioned than the mean of squares minus the squared mean):
one `welford` reduction where the code generator has it (Triton: a long row read once), else two
passes, the mean realized first.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch

from kiln.ir.nodes import Reduction
from kiln.ir.ops import ops
from kiln.lowering.context import declines, realize
from kiln.lowering.pointwise import pointwise
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import ReductionResult, TensorValue, as_dtype
from kiln.lowering.views import squeeze

aten = torch.ops.aten


def _dims(x: TensorValue, dims: int | Sequence[int] | None) -> list[int]:
    dims = [dims] if isinstance(dims, int) else dims
    return sorted({d + x.rank if d < 0 else d for d in (dims if dims else range(x.rank))})


def _default_dtype(kind: str, x: TensorValue) -> torch.dtype:
    if kind in ("sum", "prod") and not x.dtype.is_floating_point:
        return torch.int64  # integer and bool sums accumulate in int64, as in eager
    if kind in ("any", "all"):
        return torch.uint8 if x.dtype == torch.uint8 else torch.bool
    if kind in ("argmax", "argmin"):
        return torch.int64
    return x.dtype


def reduce(kind: str, x: TensorValue, dims: int | Sequence[int] | None, keepdim: bool,
           dtype: torch.dtype | None = None) -> ReductionResult:
    """A `Reduction` of `x` over `dims` (all when empty or None), as eager's `op(x, dims, keepdim)`."""
    if x.rank == 0:  # one element, reduced over a dim of size 1 (eager accepts dim 0 or -1 here)
        return _reduce_scalar(kind, x, dtype)
    dims = _dims(x, dims)
    kept = [d for d in range(x.rank) if d not in dims]

    def inner_fn(index, rindex):
        full = [None] * x.rank
        for d, i in zip(kept, index):
            full[d] = i
        for d, r in zip(dims, rindex):
            full[d] = r
        return x.loader(full)

    node = Reduction(dtype or _default_dtype(kind, x), [x.size[d] for d in kept], [x.size[d] for d in dims], kind,
                     inner_fn, src_dtype=x.dtype)
    size = [sympy.Integer(1) if d in dims else x.size[d] for d in range(x.rank)] if keepdim else list(node.ranges)
    return ReductionResult(node, size)


def _reduce_scalar(kind: str, x: TensorValue, dtype: torch.dtype | None) -> ReductionResult:
    row = TensorValue((sympy.Integer(1),), x.dtype, lambda index: x.loader([]))
    result = reduce(kind, row, [0], False, dtype or _default_dtype(kind, x))
    return ReductionResult(result.node, [])


def _count(result: ReductionResult) -> int:
    count = sympy.Mul(*result.node.reduction_ranges)
    if not count.is_Integer:
        raise NotImplementedError("a mean over a symbolic count")  # becomes an extern call
    return int(count)


@register_lowering(aten.sum.dim_IntList)
def sum_(x: TensorValue, dims: Sequence[int] | None = None, keepdim: bool = False, *, dtype=None):
    return reduce("sum", x, dims, keepdim, dtype)


@register_lowering(aten.sum.default)
def sum_all(x: TensorValue, *, dtype=None):
    return reduce("sum", x, None, False, dtype)


@register_lowering(aten.prod.dim_int)
def prod(x: TensorValue, dim: int, keepdim: bool = False, *, dtype=None):
    return reduce("prod", x, [dim], keepdim, dtype)


@register_lowering(aten.prod.default)
def prod_all(x: TensorValue, *, dtype=None):
    return reduce("prod", x, None, False, dtype)


@register_lowering(aten.amax.default)
def amax(x: TensorValue, dims: Sequence[int] = (), keepdim: bool = False):
    return reduce("max", x, dims, keepdim)


@register_lowering(aten.amin.default)
def amin(x: TensorValue, dims: Sequence[int] = (), keepdim: bool = False):
    return reduce("min", x, dims, keepdim)


@register_lowering(aten.any.dim, aten.any.dims, aten.any.default)
def any_(x: TensorValue, dim: Any = None, keepdim: bool = False):
    return reduce("any", x, dim, keepdim)


@register_lowering(aten.all.dim, aten.all.dims, aten.all.default)
def all_(x: TensorValue, dim: Any = None, keepdim: bool = False):
    return reduce("all", x, dim, keepdim)


@register_lowering(aten.argmax.default)
def argmax(x: TensorValue, dim: int | None = None, keepdim: bool = False):
    return reduce("argmax", x, dim, keepdim)


@register_lowering(aten.argmin.default)
def argmin(x: TensorValue, dim: int | None = None, keepdim: bool = False):
    return reduce("argmin", x, dim, keepdim)


@register_lowering(aten.mean.dim)
def mean(x: TensorValue, dims: Sequence[int] | None = None, keepdim: bool = False, *, dtype=None):
    result = reduce("sum", x, dims, keepdim, dtype)
    count = _count(result)
    result.then = lambda total: pointwise("truediv", [total, count])
    return result


@register_lowering(aten.mean.default)
def mean_all(x: TensorValue, *, dtype=None):
    return mean(x, None, False, dtype=dtype)


def _squared_deviation(v: Any, m: Any) -> Any:
    d = ops.sub(v, m)
    return ops.mul(d, d)


def variance(x: TensorValue, dims: Any, correction: float, keepdim: bool,
             with_mean: bool = False) -> tuple[ReductionResult, TensorValue | None]:
    """(the variance as a ReductionResult, the mean realized at keepdim=True size where the
    variance needs it or `with_mean`, else None)."""
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"variance of {x.dtype}")  # eager rejects integers
    if declines("welford"):
        mean_value = realize(mean(x, dims, keepdim=True))
        result = reduce("sum", pointwise(_squared_deviation, [x, mean_value]), dims, keepdim)
    else:
        mean_value = realize(mean(x, dims, keepdim=True)) if with_mean else None
        result = reduce("welford", x, dims, keepdim)
    divisor = max(_count(result) - correction, 0)  # eager divides by zero (inf, NaN) past the count
    result.then = lambda total: pointwise("truediv", [total, divisor])
    return result, mean_value


def _correction(correction: float | None) -> float:
    return 1 if correction is None else correction


@register_lowering(aten.var.correction)
def var(x: TensorValue, dims: Any = None, *, correction: float | None = None, keepdim: bool = False):
    return variance(x, dims, _correction(correction), keepdim)[0]


@register_lowering(aten.std.correction)
def std(x: TensorValue, dims: Any = None, *, correction: float | None = None, keepdim: bool = False):
    result = variance(x, dims, _correction(correction), keepdim)[0]
    divide = result.then
    result.then = lambda total: pointwise("sqrt", [divide(total)])
    return result


@register_lowering(aten.var_mean.correction)
def var_mean(x: TensorValue, dims: Any = None, *, correction: float | None = None, keepdim: bool = False):
    result, mean_value = variance(x, dims, _correction(correction), keepdim, with_mean=True)
    return result, mean_value if keepdim else squeeze(mean_value, _dims(x, dims))


@register_lowering(aten.max.default)
def max_all(x: TensorValue):
    return reduce("max", x, None, False)


@register_lowering(aten.min.default)
def min_all(x: TensorValue):
    return reduce("min", x, None, False)


@register_lowering(aten.max.dim)
def max_dim(x: TensorValue, dim: int, keepdim: bool = False):
    return reduce("max", x, [dim], keepdim), reduce("argmax", x, [dim], keepdim)


@register_lowering(aten.min.dim)
def min_dim(x: TensorValue, dim: int, keepdim: bool = False):
    return reduce("min", x, [dim], keepdim), reduce("argmin", x, [dim], keepdim)


@register_lowering(aten.linalg_vector_norm.default)
def vector_norm(x: TensorValue, ord: float = 2, dim: Any = None, keepdim: bool = False, *, dtype=None):
    """The `ord`-norm: max or min of |x| for ±inf, the count of nonzeros for 0, else
    sum(|x|^ord)^(1/ord) (a plain sum for 1, a square root of squares for 2)."""
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"vector norm of {x.dtype}")
    if dtype is not None:
        x = as_dtype(x, dtype)
    magnitude = pointwise("abs", [x])
    if ord in (math.inf, -math.inf):
        return reduce("max" if ord > 0 else "min", magnitude, dim, keepdim)
    if ord == 0:
        return reduce("sum", pointwise(lambda v: ops.to_dtype(ops.ne(v, ops.constant(0, x.dtype)), x.dtype), [x]), dim, keepdim)
    if ord == 1:
        return reduce("sum", magnitude, dim, keepdim)
    if ord == 2:
        result = reduce("sum", pointwise(lambda v: ops.mul(v, v), [x]), dim, keepdim)
        result.then = lambda total: pointwise("sqrt", [total])
        return result
    result = reduce("sum", pointwise("pow", [magnitude, float(ord)]), dim, keepdim)
    result.then = lambda total: pointwise("pow", [total, 1.0 / ord])
    return result
