"""Division with rounding, remainder and fmod, bit-exact with eager.

Integers: eager raises ZeroDivisionError for a zero divisor, which a kernel cannot do, so integer
division lowers only by a nonzero Python-number divisor; a tensor divisor stays an extern call.
Floats: floor division follows eager's fmod-based formula (plain floor(a / b) differs where the
quotient rounds up to a whole number, e.g. 1 // 0.1 is 9, not 10).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind

from kiln.ir.ops import ops
from kiln.lowering.pointwise import pointwise, promoted_dtypes
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue

aten = torch.ops.aten


def _division_dtype(a: Any, b: Any) -> torch.dtype:
    """The compute dtype; declines integer division unless by a nonzero number."""
    dtype = promoted_dtypes([a, b])[0]
    if dtype.is_floating_point:
        return dtype
    if dtype == torch.bool:
        raise NotImplementedError("division of bools")  # eager rejects it
    if isinstance(b, TensorValue) or b == 0:
        raise NotImplementedError("integer division by a tensor or by zero (eager raises ZeroDivisionError)")
    return dtype


def _opposite_signs(x, y, zero):
    return ops.ne(ops.lt(x, zero), ops.lt(y, zero))


def _floor_div_float(dtype: torch.dtype):
    def body(a, b):
        zero, one = ops.constant(0, dtype), ops.constant(1, dtype)
        mod = ops.fmod(a, b)
        div = ops.truediv(ops.sub(a, mod), b)
        div = ops.where(ops.logical_and(ops.ne(mod, zero), _opposite_signs(b, mod, zero)), ops.sub(div, one), div)
        floor = ops.floor(div)
        floor = ops.where(ops.gt(ops.sub(div, floor), ops.constant(0.5, dtype)), ops.add(floor, one), floor)
        whole = ops.where(ops.ne(div, zero), floor, ops.copysign(zero, ops.truediv(a, b)))
        return ops.where(ops.eq(b, zero), ops.truediv(a, b), whole)  # x // 0 is inf or NaN, as a / 0

    return body


def floor_divide_value(a: Any, b: Any) -> TensorValue:
    dtype = _division_dtype(a, b)
    return pointwise(_floor_div_float(dtype) if dtype.is_floating_point else "floordiv", [a, b])


def _trunc_div_int(dtype: torch.dtype):
    def body(a, b):
        zero, one = ops.constant(0, dtype), ops.constant(1, dtype)
        floor = ops.floordiv(a, b)
        inexact = ops.ne(ops.remainder(a, b), zero)
        return ops.where(ops.logical_and(inexact, _opposite_signs(a, b, zero)), ops.add(floor, one), floor)

    return body


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a: Any, b: Any, *, rounding_mode: str | None = None) -> TensorValue:
    if rounding_mode is None:
        return pointwise("truediv", [a, b], Kind.INT_TO_FLOAT)
    if rounding_mode == "floor":
        return floor_divide_value(a, b)
    dtype = _division_dtype(a, b)
    if dtype.is_floating_point:
        return pointwise(lambda x, y: ops.trunc(ops.truediv(x, y)), [a, b])
    return pointwise(_trunc_div_int(dtype), [a, b])


@register_lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(a: Any, b: Any) -> TensorValue:
    return floor_divide_value(a, b)


@register_lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(a: Any, b: Any) -> TensorValue:
    _division_dtype(a, b)
    return pointwise("remainder", [a, b])  # the sign of the divisor


@register_lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(a: Any, b: Any) -> TensorValue:
    dtype = _division_dtype(a, b)
    if dtype.is_floating_point:
        return pointwise("fmod", [a, b])

    def body(x, y):  # the sign of the dividend: move remainder's result across when signs differ
        zero = ops.constant(0, dtype)
        r = ops.remainder(x, y)
        return ops.where(ops.logical_and(ops.ne(r, zero), _opposite_signs(r, x, zero)), ops.sub(r, y), r)

    return pointwise(body, [a, b])
