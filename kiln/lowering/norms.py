"""Layer, batch and group norm: statistics as realized reductions, the normalization pointwise.

Statistics are two passes (the mean, then the mean squared deviation from it), each a sum of
terms already divided by the count, so no per-element division is left for the readers. The
mean is summed around the row's first element (shifted data): a constant row's mean is then
that element exactly, so it normalizes to exactly 0 (to the bias), as in eager, where a sum of
x / n rounded a little off and 1/sqrt(eps) magnified it (4.7e-6 at weight 1). Low-precision
inputs compute in float32.
"""

from __future__ import annotations

from typing import Sequence

import sympy
import torch

from kiln.ir.indexing import FloorDiv
from kiln.ir.ops import ops
from kiln.lowering.context import declines, realize
from kiln.lowering.creation import filled
from kiln.lowering.pointwise import pointwise
from kiln.lowering.reductions import reduce
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue, as_dtype
from kiln.lowering.views import slice_, view

aten = torch.ops.aten
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _compute_dtype(x: TensorValue) -> torch.dtype:
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"normalization of {x.dtype}")
    return torch.float32 if x.dtype in _LOW_PRECISION else x.dtype


def moments(x: TensorValue, dims: Sequence[int]) -> tuple[TensorValue, TensorValue]:
    """(mean, biased variance) of `x` over `dims`, realized at keepdim size."""
    count = sympy.Mul(*(x.size[d] for d in dims))
    if not count.is_Integer or count == 0:
        raise NotImplementedError("statistics over a symbolic or empty count")
    scale = 1.0 / int(count)
    first = x
    for d in dims:
        first = slice_(first, d, 0, 1)

    def scaled_shift(v, f):
        return ops.mul(ops.sub(v, f), ops.constant(scale, x.dtype))

    shifted = realize(reduce("sum", pointwise(scaled_shift, [x, first]), dims, keepdim=True))
    mean = realize(pointwise("add", [first, shifted]))

    if not declines("welford"):  # the squared deviations from the row's own mean, in one pass
        deviations = reduce("welford", x, dims, keepdim=True)
        deviations.then = lambda total: pointwise(lambda d: ops.mul(d, ops.constant(scale, x.dtype)), [total])
        return mean, realize(deviations)

    def scaled_square(v, m):
        d = ops.sub(v, m)
        return ops.mul(ops.mul(d, d), ops.constant(scale, x.dtype))

    var = realize(reduce("sum", pointwise(scaled_square, [x, mean]), dims, keepdim=True))
    return mean, var


def _rsqrt_plus(var: TensorValue, eps: float) -> TensorValue:
    return realize(pointwise(lambda v: ops.rsqrt(ops.add(v, ops.constant(eps, var.dtype))), [var]))


@register_lowering(aten.native_layer_norm.default)
def native_layer_norm(x: TensorValue, normalized_shape: Sequence[int], weight: TensorValue | None,
                      bias: TensorValue | None, eps: float) -> tuple[TensorValue, TensorValue, TensorValue]:
    """(out, mean, rstd); mean and rstd keep x's leading dims and have size 1 in the normalized ones."""
    dtype = _compute_dtype(x)
    xc = as_dtype(x, dtype)
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    mean, var = moments(xc, dims)
    rstd = _rsqrt_plus(var, eps)
    out = pointwise("mul", [pointwise("sub", [xc, mean]), rstd])
    if weight is not None:
        out = pointwise("mul", [out, as_dtype(weight, dtype)])
    if bias is not None:
        out = pointwise("add", [out, as_dtype(bias, dtype)])
    return as_dtype(out, x.dtype), as_dtype(mean, x.dtype), as_dtype(rstd, x.dtype)


def _per_channel(v: TensorValue | None, rank: int, default: float, dtype: torch.dtype) -> TensorValue | float:
    """A [C] tensor shaped [C, 1, ...] to broadcast along dim 1 of a rank-`rank` input."""
    if v is None:
        return default
    return view(as_dtype(v, dtype), [v.size[0]] + [1] * (rank - 2))


def _normalized(x: TensorValue, mean: TensorValue, invstd: TensorValue, weight: TensorValue | None,
                bias: TensorValue | None, dtype: torch.dtype) -> TensorValue:
    """x * alpha + beta with alpha = invstd * weight and beta = bias - mean * alpha per channel,
    realized once ([C] each): eager's CPU kernels compute batch norm in this form."""
    alpha = invstd if weight is None else realize(pointwise("mul", [invstd, as_dtype(weight, dtype)]))
    shift = pointwise("mul", [mean, alpha])
    beta = realize(pointwise("neg", [shift]) if bias is None else pointwise("sub", [as_dtype(bias, dtype), shift]))
    scaled = pointwise("mul", [as_dtype(x, dtype), _per_channel(alpha, x.rank, 1.0, dtype)])
    return as_dtype(pointwise("add", [scaled, _per_channel(beta, x.rank, 0.0, dtype)]), x.dtype)


@register_lowering(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None,
                         running_mean: TensorValue, running_var: TensorValue, momentum: float, eps: float):
    """(out, empty, empty), normalized with the running statistics."""
    dtype = _compute_dtype(x)
    if x.rank < 2:
        raise NotImplementedError("batch norm of a tensor without a channel dim")
    invstd = _rsqrt_plus(as_dtype(running_var, dtype), eps)
    out = _normalized(x, as_dtype(running_mean, dtype), invstd, weight, bias, dtype)
    empty = filled([0], 0, running_mean.dtype if running_mean.dtype.is_floating_point else dtype)
    return out, empty, empty


@register_lowering(aten._native_batch_norm_legit_functional.default)
def batch_norm_training(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None,
                        running_mean: TensorValue, running_var: TensorValue, training: bool, momentum: float, eps: float):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var), statistics over all dims
    but the channels; the running variance is updated with the unbiased variance, as eager."""
    if not training:
        out, empty, _ = batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps)
        return out, empty, empty, running_mean, running_var
    dtype = _compute_dtype(x)
    dims = [d for d in range(x.rank) if d != 1]
    count = sympy.Mul(*(x.size[d] for d in dims))
    if x.rank < 2 or not count.is_Integer or count < 2:
        raise NotImplementedError("batch norm statistics of fewer than two values per channel")
    # Eager sums batch statistics, and takes 1/sqrt of the variance, in double: over a whole batch
    # float32 sums lose digits that the backward's near-cancelling terms then amplify.
    channels = [x.size[1]]
    mean, var = (view(v, channels) for v in moments(as_dtype(x, torch.float64), dims))
    save_mean = realize(as_dtype(mean, dtype))
    save_invstd = realize(as_dtype(pointwise(lambda v: ops.rsqrt(ops.add(v, ops.constant(eps, torch.float64))), [var]), dtype))
    out = _normalized(x, save_mean, save_invstd, weight, bias, dtype)
    unbiased = pointwise("mul", [var, int(count) / (int(count) - 1)])
    new_mean, new_var = _running_update(running_mean, mean, momentum), _running_update(running_var, unbiased, momentum)
    return out, save_mean, save_invstd, new_mean, new_var


def _running_update(running: TensorValue, batch: TensorValue, momentum: float) -> TensorValue:
    blended = pointwise("add", [pointwise("mul", [batch, momentum]), pointwise("mul", [running, 1 - momentum])])
    return as_dtype(blended, running.dtype)


@register_lowering(aten.native_group_norm.default)
def native_group_norm(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None, n: int, c: int,
                      hw: int, group: int, eps: float) -> tuple[TensorValue, TensorValue, TensorValue]:
    """(out, mean, rstd): statistics per (sample, group of c/group channels), mean and rstd [n, group]."""
    dtype = _compute_dtype(x)
    if not all(isinstance(v, int) for v in (n, c, hw, group)) or c % group:
        raise NotImplementedError("group norm with symbolic sizes")
    xc = as_dtype(x, dtype)
    mean, var = moments(view(xc, [n, group, c // group * hw]), [2])
    rstd = _rsqrt_plus(var, eps)

    def per_group(stat: TensorValue) -> TensorValue:  # read at [sample, channel // channels-per-group]
        return TensorValue(x.size, dtype, lambda index: stat.loader([index[0], FloorDiv(index[1], c // group), sympy.Integer(0)]))

    out = pointwise("mul", [pointwise("sub", [xc, per_group(mean)]), per_group(rstd)])
    if weight is not None:
        out = pointwise("mul", [out, _per_channel(weight, x.rank, 1.0, dtype)])
    if bias is not None:
        out = pointwise("add", [out, _per_channel(bias, x.rank, 0.0, dtype)])
    return as_dtype(out, x.dtype), as_dtype(view(mean, [n, group]), x.dtype), as_dtype(view(rstd, [n, group]), x.dtype)
