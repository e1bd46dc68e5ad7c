"""Pointwise ops written as small bodies of protocol ops, each following eager's formula,
including what it does with NaN, infinities and signed zeros."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind

from kiln.ir.ops import ops
from kiln.lowering.pointwise import pointwise, promoted_dtypes
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue, as_dtype, broadcast_sizes, broadcast_to

aten = torch.ops.aten
_FLOAT, _BOOL = Kind.INT_TO_FLOAT, Kind.ALWAYS_BOOL


def _float_test(x: TensorValue, test, integer_answer: bool) -> TensorValue:
    """A bool-valued test of a float, constant for integers (which are finite and never NaN)."""
    if not x.dtype.is_floating_point:
        return pointwise(lambda v: ops.constant(integer_answer, torch.bool), [x], _BOOL)
    compute = promoted_dtypes([x], _BOOL)[0]
    return pointwise(lambda v: test(v, lambda: ops.constant(math.inf, compute)), [x], _BOOL)


@register_lowering(aten.isnan.default)
def isnan(x: TensorValue) -> TensorValue:
    return _float_test(x, lambda v, inf: ops.ne(v, v), False)


@register_lowering(aten.isinf.default)
def isinf(x: TensorValue) -> TensorValue:
    return _float_test(x, lambda v, inf: ops.eq(ops.abs(v), inf()), False)


@register_lowering(aten.isfinite.default)
def isfinite(x: TensorValue) -> TensorValue:
    return _float_test(x, lambda v, inf: ops.lt(ops.abs(v), inf()), True)  # NaN compares false


@register_lowering(aten.isposinf.default)
def isposinf(x: TensorValue) -> TensorValue:
    return _float_test(x, lambda v, inf: ops.eq(v, inf()), False)


@register_lowering(aten.isneginf.default)
def isneginf(x: TensorValue) -> TensorValue:
    return _float_test(x, lambda v, inf: ops.eq(v, ops.neg(inf())), False)


@register_lowering(aten.signbit.default)
def signbit(x: TensorValue) -> TensorValue:
    if not x.dtype.is_floating_point:
        return pointwise("lt", [x, 0], _BOOL)
    return pointwise("signbit", [x], _BOOL)  # -0.0 and -NaN included


@register_lowering(aten.nan_to_num.default)
def nan_to_num(x: TensorValue, nan: float | None = 0.0, posinf: float | None = None, neginf: float | None = None) -> TensorValue:
    if not x.dtype.is_floating_point:
        return x
    info = torch.finfo(x.dtype)
    nan = 0.0 if nan is None else nan
    posinf, neginf = info.max if posinf is None else posinf, info.min if neginf is None else neginf
    dtype = promoted_dtypes([x])[0]

    def body(v):
        c = lambda value: ops.constant(value, dtype)  # noqa: E731
        out = ops.where(ops.eq(v, c(math.inf)), c(posinf), v)
        out = ops.where(ops.eq(v, c(-math.inf)), c(neginf), out)
        return ops.where(ops.ne(v, v), c(nan), out)

    return pointwise(body, [x])


@register_lowering(aten.frac.default)
def frac(x: TensorValue) -> TensorValue:
    return pointwise(lambda v: ops.sub(v, ops.trunc(v)), [x])


@register_lowering(aten.round.decimals)
def round_decimals(x: TensorValue, *, decimals: int = 0) -> TensorValue:
    # Eager scales by 10^|decimals|, rounds half to even, and scales back.
    scale = float(10 ** abs(decimals))
    dtype = promoted_dtypes([x])[0]
    if decimals >= 0:
        body = lambda v: ops.truediv(ops.round(ops.mul(v, ops.constant(scale, dtype))), ops.constant(scale, dtype))  # noqa: E731
    else:
        body = lambda v: ops.mul(ops.round(ops.truediv(v, ops.constant(scale, dtype))), ops.constant(scale, dtype))  # noqa: E731
    return pointwise(body, [x])


def _clamped(x: Any, low: Any, high: Any) -> TensorValue:
    """min(max(x, low), high), NaN anywhere giving NaN, with eager's promotion over all three."""
    args = [a for a in (x, low, high) if a is not None]
    if len(args) == 1:
        raise NotImplementedError("clamp without bounds")  # eager raises; the extern will too

    def body(*values):
        it = iter(values)
        out = next(it)
        if low is not None:
            out = ops.maximum(out, next(it))
        if high is not None:
            out = ops.minimum(out, next(it))
        return out

    return pointwise(body, args)


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def clamp(x: TensorValue, min: Any = None, max: Any = None) -> TensorValue:
    return _clamped(x, min, max)


@register_lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x: TensorValue, min: Any) -> TensorValue:
    return _clamped(x, min, None)


@register_lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x: TensorValue, max: Any) -> TensorValue:
    return _clamped(x, None, max)


@register_lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(start: TensorValue, end: Any, weight: Any) -> TensorValue:
    dtype = promoted_dtypes([start, end, weight])[0]

    def body(a, b, w):  # eager's two-sided formula: exact at weight 0 and at weight 1
        one, half = ops.constant(1, dtype), ops.constant(0.5, dtype)
        diff = ops.sub(b, a)
        return ops.where(ops.lt(ops.abs(w), half), ops.add(a, ops.mul(w, diff)), ops.sub(b, ops.mul(diff, ops.sub(one, w))))

    return pointwise(body, [start, end, weight])


@register_lowering(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)
def xlogy(x: Any, y: Any) -> TensorValue:
    dtype = promoted_dtypes([x, y], _FLOAT)[0]

    def body(a, b):
        zero = ops.constant(0, dtype)
        product = ops.where(ops.eq(a, zero), zero, ops.mul(a, ops.log(b)))
        return ops.where(ops.ne(b, b), b, product)  # NaN in y wins, even where x is 0

    return pointwise(body, [x, y], _FLOAT)


@register_lowering(aten.heaviside.default)
def heaviside(x: TensorValue, values: TensorValue) -> TensorValue:
    dtype = promoted_dtypes([x, values])[0]

    def body(a, v):
        zero = ops.constant(0, dtype)
        return ops.where(ops.eq(a, zero), v, ops.to_dtype(ops.gt(a, zero), dtype))

    return pointwise(body, [x, values])


@register_lowering(aten.logical_xor.default)
def logical_xor(a: Any, b: Any) -> TensorValue:
    truth = lambda v: ops.to_dtype(v, torch.bool)  # noqa: E731  (NaN is true, as in eager)
    return pointwise(lambda u, v: ops.ne(truth(u), truth(v)), [a, b], _BOOL)


@register_lowering(aten.sgn.default)
def sgn(x: TensorValue) -> TensorValue:
    if x.dtype.is_complex:
        raise NotImplementedError("sgn of complex tensors")
    return pointwise("sign", [x])


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x: TensorValue, mask: TensorValue, value: Any) -> TensorValue:
    # x and mask broadcast together; the result keeps x's dtype, the fill value is cast to it.
    if isinstance(value, TensorValue) and value.rank:
        raise NotImplementedError("masked_fill with a non-scalar value tensor")  # eager rejects it
    size = broadcast_sizes(x.size, mask.size)
    x, mask = broadcast_to(x, size), broadcast_to(mask, size)

    def loader(index):
        fill = ops.to_dtype(value.loader([]), x.dtype) if isinstance(value, TensorValue) else ops.constant(value, x.dtype)
        return ops.where(mask.loader(index), fill, x.loader(index))

    return TensorValue(size, x.dtype, loader)


def _nan_ignoring(pick: str):
    def lower(a: Any, b: Any) -> TensorValue:
        # Unlike maximum/minimum, a NaN loses to a number: NaN only where both are NaN.
        def body(u, v):
            return ops.where(ops.ne(u, u), v, ops.where(ops.ne(v, v), u, getattr(ops, pick)(u, v)))

        return pointwise(body, [a, b])

    return lower


register_lowering(aten.fmax.default)(_nan_ignoring("maximum"))
register_lowering(aten.fmin.default)(_nan_ignoring("minimum"))


@register_lowering(aten.hardtanh.default)
def hardtanh(x: TensorValue, min_val: float = -1.0, max_val: float = 1.0) -> TensorValue:
    return _clamped(x, min_val, max_val)


@register_lowering(aten.leaky_relu.default)
def leaky_relu(x: TensorValue, negative_slope: float = 0.01) -> TensorValue:
    dtype = promoted_dtypes([x])[0]

    def body(v):
        return ops.where(ops.gt(v, ops.constant(0, dtype)), v, ops.mul(v, ops.constant(negative_slope, dtype)))

    return pointwise(body, [x])


@register_lowering(aten.elu.default)
def elu(x: TensorValue, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> TensorValue:
    dtype = promoted_dtypes([x])[0]

    def body(v):
        c = lambda value: ops.constant(value, dtype)  # noqa: E731
        negative = ops.mul(ops.expm1(ops.mul(v, c(input_scale))), c(alpha * scale))
        return ops.where(ops.gt(v, c(0)), ops.mul(v, c(scale)), negative)

    return pointwise(body, [x])


@register_lowering(aten.copy.default)
def copy(dst: TensorValue, src: Any, non_blocking: bool = False) -> TensorValue:
    # Functional copy: src broadcast to dst's size, in dst's dtype; dst's values are not read.
    if not isinstance(src, TensorValue):
        raise NotImplementedError("copy from a non-tensor")
    return as_dtype(broadcast_to(src, dst.size), dst.dtype)
