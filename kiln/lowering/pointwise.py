"""Pointwise lowerings: type promotion and broadcasting once, in `register_pointwise`."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

from kiln.ir.ops import ops
from kiln.lowering.context import declines
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import LOW_PRECISION, TensorValue, broadcast_sizes, broadcast_to, round_low_precision

aten = torch.ops.aten


def _promotion_example(arg: Any) -> Any:
    # elementwise_dtypes wants tensors or numbers; a meta tensor of the right rank and dtype will do.
    return torch.empty([1] * arg.rank, dtype=arg.dtype, device="meta") if isinstance(arg, TensorValue) else arg


def _cast(value: Any, have: torch.dtype, want: torch.dtype) -> Any:
    return value if have == want else ops.to_dtype(value, want)


def _result(value: Any, compute: torch.dtype, result: torch.dtype) -> Any:
    # A 16-bit float result stays in float32 until it is stored or cast (values.LOW_PRECISION).
    return value if result in LOW_PRECISION and compute == torch.float32 else _cast(value, compute, result)


def promoted_dtypes(args: list[Any], kind: Kind = Kind.DEFAULT) -> tuple[torch.dtype, torch.dtype]:
    """(compute dtype, result dtype) of an elementwise op over tensors and Python scalars, as eager."""
    return elementwise_dtypes(*[_promotion_example(a) for a in args], type_promotion_kind=kind)


# Arithmetic on bools is logic in eager (true + true is true); C++ would make an int of it (2),
# which a later max or comparison then reads as a number.
_BOOL_ARITHMETIC = {"add": "logical_or", "mul": "logical_and"}


def pointwise(op: str | Callable[..., Any], args: list[Any], kind: Kind = Kind.DEFAULT) -> TensorValue:
    """`ops.<op>` (or `op(*values)`, a body of ops calls) applied elementwise to tensors and Python
    scalars, with eager's promotion: operands cast to the compute dtype, the result to eager's."""
    if isinstance(op, str) and declines(op):
        raise NotImplementedError(f"ops.{op}: the code generator has no code for it")  # an extern call
    compute, result = promoted_dtypes(args, kind)
    if compute == torch.bool and isinstance(op, str):
        op = _BOOL_ARITHMETIC.get(op, op)
    size = broadcast_sizes(*(a.size for a in args if isinstance(a, TensorValue)))
    inputs = [broadcast_to(a, size) if isinstance(a, TensorValue) else a for a in args]
    body = (lambda *values: getattr(ops, op)(*values)) if isinstance(op, str) else op

    def loader(index):
        values = [
            _cast(a.loader(index), a.dtype, compute) if isinstance(a, TensorValue) else ops.constant(a, compute)
            for a in inputs
        ]
        return _result(body(*values), compute, result)

    return TensorValue(size, result, loader)


def register_pointwise(op_name: str, *overloads: torch._ops.OpOverload, kind: Kind = Kind.DEFAULT) -> None:
    def lower(*args: Any) -> TensorValue:
        return pointwise(op_name, list(args), kind)

    register_lowering(*overloads)(lower)


_FLOAT = Kind.INT_TO_FLOAT
_BOOL = Kind.ALWAYS_BOOL
# Unary ops that compute in floating point (integers are promoted first, as in eager).
for _name in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "expm1", "log1p", "reciprocal",
              "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "exp2", "log2", "log10",
              "erfc", "lgamma"):
    register_pointwise(_name, getattr(aten, _name).default, kind=_FLOAT)
for _name in ("neg", "abs", "relu"):
    register_pointwise(_name, getattr(aten, _name).default)


@register_lowering(aten.sign.default)
def sign(x: TensorValue) -> TensorValue:
    # A bool's sign is itself (C++ would compare a bool vector with 0, which it cannot order).
    return x if x.dtype == torch.bool else pointwise("sign", [x])


for _name in ("maximum", "minimum"):
    register_pointwise(_name, getattr(aten, _name).default)
for _name in ("atan2", "hypot"):
    register_pointwise(_name, getattr(aten, _name).default, kind=_FLOAT)
register_pointwise("copysign", aten.copysign.Tensor, aten.copysign.Scalar, kind=_FLOAT)
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register_pointwise(_name, getattr(aten, _name).Tensor, getattr(aten, _name).Scalar, kind=_BOOL)
register_pointwise("logical_not", aten.logical_not.default, kind=_BOOL)
register_pointwise("logical_and", aten.logical_and.default, kind=_BOOL)
register_pointwise("logical_or", aten.logical_or.default, kind=_BOOL)
register_pointwise("mul", aten.mul.Tensor, aten.mul.Scalar)
register_pointwise("truediv", aten.div.Tensor, aten.div.Scalar, kind=_FLOAT)


# Small constant exponents as products and roots, as eager's kernel computes them: exact where
# a general pow (exp·log) would be off by an ulp, which then differs from eager (T5's variance,
# x.pow(2).mean(), decides ReLU masks downstream).
_EXACT_POWERS = {
    2: lambda x: ops.mul(x, x),
    3: lambda x: ops.mul(ops.mul(x, x), x),
    0.5: lambda x: ops.sqrt(x),
    -0.5: lambda x: ops.rsqrt(x),
    -1: lambda x: ops.reciprocal(x),
    -2: lambda x: ops.reciprocal(ops.mul(x, x)),
}


@register_lowering(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(base: Any, exponent: Any) -> TensorValue:
    dtype = promoted_dtypes([base, exponent], Kind.BOOL_TO_LONG)[1]
    if dtype.is_floating_point:
        exact = _EXACT_POWERS.get(exponent) if isinstance(base, TensorValue) and type(exponent) in (int, float) else None
        return pointwise(exact or "pow", [base] if exact else [base, exponent], Kind.BOOL_TO_LONG)
    # Integer powers must be exact (std::pow goes through double): small constant exponents only.
    if not isinstance(exponent, int) or isinstance(exponent, bool) or not 0 <= exponent <= 8:
        raise NotImplementedError("an integer power by a tensor or a large exponent")

    def body(v):
        out = ops.constant(1, dtype)
        for _ in range(exponent):
            out = ops.mul(out, v)
        return out

    return pointwise(body, [base], Kind.BOOL_TO_LONG)


def _rounding(name: str):
    def lower(x: TensorValue) -> TensorValue:
        # Integers are already whole (and C++'s std::floor of one would go through double).
        return x if not x.dtype.is_floating_point else pointwise(name, [x])

    return lower


for _name in ("floor", "ceil", "trunc", "round"):
    register_lowering(getattr(aten, _name).default)(_rounding(_name))


def _with_alpha(name: str, a: Any, b: Any, alpha: Any) -> TensorValue:
    """a + alpha * b (or -) as eager computes it: alpha takes the operands' dtype and no part in
    their promotion (bools: b counts if alpha is nonzero)."""
    if alpha == 1:
        return pointwise(name, [a, b])
    compute, _ = promoted_dtypes([a, b])
    if compute == torch.bool:
        return pointwise(name, [a, b]) if alpha else pointwise(lambda x, y: x, [a, b])
    return pointwise(lambda x, y: getattr(ops, name)(x, ops.mul(y, ops.constant(alpha, compute))), [a, b])


@register_lowering(aten.add.Tensor, aten.add.Scalar)
def add(a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    return _with_alpha("add", a, b, alpha)


@register_lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    return _with_alpha("sub", a, b, alpha)


@register_lowering(aten.where.self)
def where(condition: TensorValue, a: Any, b: Any) -> TensorValue:
    _, result = elementwise_dtypes(_promotion_example(a), _promotion_example(b), type_promotion_kind=Kind.NO_OPMATH)
    size = broadcast_sizes(*(v.size for v in (condition, a, b) if isinstance(v, TensorValue)))
    cond = broadcast_to(condition, size)
    branches = [broadcast_to(v, size) if isinstance(v, TensorValue) else v for v in (a, b)]

    def load(v: Any, index):
        return _cast(v.loader(index), v.dtype, result) if isinstance(v, TensorValue) else ops.constant(v, result)

    return TensorValue(size, result, lambda index: ops.where(cond.loader(index), *(load(v, index) for v in branches)))


@register_lowering(aten.gelu.default)
def gelu(x: TensorValue, *, approximate: str = "none") -> TensorValue:
    if approximate != "none":
        inner = pointwise("mul", [pointwise("add", [x, pointwise("mul", [pointwise("pow", [x, 3]), 0.044715])]),
                                  math.sqrt(2 / math.pi)])
        return pointwise("mul", [pointwise("mul", [x, 0.5]), pointwise("add", [pointwise("tanh", [inner]), 1.0])])
    cdf = pointwise("mul", [pointwise("add", [pointwise("erf", [pointwise("mul", [x, 1 / math.sqrt(2)])]), 1.0]), 0.5])
    return pointwise("mul", [x, cdf])


@register_lowering(aten._to_copy.default)
def to_copy(x: TensorValue, *, dtype: torch.dtype | None = None, device: Any = None, layout: Any = None,
            memory_format: Any = None, pin_memory: Any = None, non_blocking: bool = False) -> TensorValue:
    if device is not None and torch.device(device).type != "cpu" or layout not in (None, torch.strided):
        raise NotImplementedError("_to_copy to another device or layout")  # an extern call
    dtype = dtype or x.dtype
    if dtype == x.dtype:
        return TensorValue(x.size, dtype, x.loader)  # a copy: not the same buffer
    # An explicit cast converts the 16-bit values eager's tensor holds: round first.
    return TensorValue(x.size, dtype, lambda index: _cast(round_low_precision(x.loader(index), x.dtype), x.dtype, dtype))
