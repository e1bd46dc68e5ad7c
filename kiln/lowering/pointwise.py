"""Pointwise lowerings: type promotion and broadcasting once, in `register_pointwise`."""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

from kiln.ir.ops import ops
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue, broadcast_sizes, broadcast_to

aten = torch.ops.aten


def _promotion_example(arg: Any) -> Any:
    # elementwise_dtypes wants tensors or numbers; a meta tensor of the right rank and dtype will do.
    return torch.empty([1] * arg.rank, dtype=arg.dtype, device="meta") if isinstance(arg, TensorValue) else arg


def _cast(value: Any, have: torch.dtype, want: torch.dtype) -> Any:
    return value if have == want else ops.to_dtype(value, want)


def pointwise(name: str, args: list[Any], kind: Kind = Kind.DEFAULT) -> TensorValue:
    """`ops.<name>` applied elementwise to tensors and Python scalars, with eager's promotion."""
    compute, result = elementwise_dtypes(*[_promotion_example(a) for a in args], type_promotion_kind=kind)
    size = broadcast_sizes(*(a.size for a in args if isinstance(a, TensorValue)))
    inputs = [broadcast_to(a, size) if isinstance(a, TensorValue) else a for a in args]

    def loader(index):
        values = [
            _cast(a.loader(index), a.dtype, compute) if isinstance(a, TensorValue) else ops.constant(a, compute)
            for a in inputs
        ]
        return _cast(getattr(ops, name)(*values), compute, result)

    return TensorValue(size, result, loader)


def register_pointwise(op_name: str, *overloads: torch._ops.OpOverload, kind: Kind = Kind.DEFAULT) -> None:
    def lower(*args: Any) -> TensorValue:
        return pointwise(op_name, list(args), kind)

    register_lowering(*overloads)(lower)


_FLOAT = Kind.INT_TO_FLOAT
_BOOL = Kind.ALWAYS_BOOL
for _name, _kind in {"exp": _FLOAT, "log": _FLOAT, "sqrt": _FLOAT, "rsqrt": _FLOAT, "sin": _FLOAT, "cos": _FLOAT,
                     "tanh": _FLOAT, "sigmoid": _FLOAT, "erf": _FLOAT, "expm1": _FLOAT, "log1p": _FLOAT,
                     "reciprocal": _FLOAT, "neg": Kind.DEFAULT, "abs": Kind.DEFAULT, "relu": Kind.DEFAULT,
                     "floor": Kind.DEFAULT, "ceil": Kind.DEFAULT, "sign": Kind.DEFAULT}.items():
    register_pointwise(_name, getattr(aten, _name).default, kind=_kind)
for _name in ("maximum", "minimum", "atan2"):
    register_pointwise(_name, getattr(aten, _name).default, kind=_FLOAT if _name == "atan2" else Kind.DEFAULT)
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register_pointwise(_name, getattr(aten, _name).Tensor, getattr(aten, _name).Scalar, kind=_BOOL)
register_pointwise("logical_not", aten.logical_not.default, kind=_BOOL)
register_pointwise("logical_and", aten.logical_and.default, kind=_BOOL)
register_pointwise("logical_or", aten.logical_or.default, kind=_BOOL)
register_pointwise("mul", aten.mul.Tensor, aten.mul.Scalar)
register_pointwise("truediv", aten.div.Tensor, aten.div.Scalar, kind=_FLOAT)
register_pointwise("pow", aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, kind=Kind.BOOL_TO_LONG)


@register_lowering(aten.add.Tensor, aten.add.Scalar)
def add(a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    return pointwise("add", [a, b if alpha == 1 else pointwise("mul", [b, alpha])])


@register_lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    return pointwise("sub", [a, b if alpha == 1 else pointwise("mul", [b, alpha])])


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
    return TensorValue(x.size, dtype, lambda index: _cast(x.loader(index), x.dtype, dtype))


def _filled(size: Any, value: Any, dtype: torch.dtype | None) -> TensorValue:
    dtype = dtype or (torch.float32 if isinstance(value, float) else torch.bool if isinstance(value, bool) else torch.int64)
    return TensorValue(tuple(sympy.sympify(s) for s in size), dtype, lambda index: ops.constant(value, dtype))


@register_lowering(aten.scalar_tensor.default)
def scalar_tensor(value: Any, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorValue:
    return _filled((), value, dtype or torch.float32)


@register_lowering(aten.full.default)
def full(size: Any, value: Any, *, dtype: torch.dtype | None = None, **kwargs: Any) -> TensorValue:
    return _filled(size, value, dtype)
