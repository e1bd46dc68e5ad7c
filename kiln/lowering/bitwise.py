"""Bitwise ops and shifts on integers and bools (floats are rejected by eager: an extern raises)."""

from __future__ import annotations

from typing import Any

import torch

from kiln.lowering.pointwise import pointwise, promoted_dtypes
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue

aten = torch.ops.aten


def _integral(args: list[Any], shift: bool = False) -> None:
    dtype = promoted_dtypes(args)[1]
    if dtype.is_floating_point or dtype.is_complex or (shift and dtype == torch.bool):
        raise NotImplementedError(f"bitwise op on {dtype}")  # eager raises; so will the extern


def _binary(name: str, shift: bool = False):
    def lower(a: Any, b: Any) -> TensorValue:
        _integral([a, b], shift)
        return pointwise(name, [a, b])

    return lower


for _name in ("and", "or", "xor"):
    _op = getattr(aten, f"bitwise_{_name}")
    register_lowering(_op.Tensor, _op.Scalar, _op.Scalar_Tensor)(_binary(f"bitwise_{_name}"))
for _side in ("left", "right"):
    _op = getattr(aten, f"bitwise_{_side}_shift")
    _dunder = getattr(aten, "__lshift__" if _side == "left" else "__rshift__")
    register_lowering(_op.Tensor, _op.Tensor_Scalar, _op.Scalar_Tensor, _dunder.Tensor, _dunder.Scalar)(
        _binary(f"bitwise_{_side}_shift", shift=True))


@register_lowering(aten.bitwise_not.default)
def bitwise_not(x: TensorValue) -> TensorValue:
    _integral([x])
    return pointwise("bitwise_not", [x])
