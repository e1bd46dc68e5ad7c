"""Random numbers in loops: `kiln::philox_dropout` (passes/dropout.py) as two pointwise values,
the scaled output and the mask, each element's number `ops.rand(seed, position)` from its
row-major position (kiln/ir/philox.py), so the values agree wherever they are computed."""

from __future__ import annotations

import sympy
import torch

import kiln.externs.dropout  # noqa: F401  (defines kiln::philox_dropout)
from kiln.ir.ops import ops
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue


def _position(size: tuple[sympy.Expr, ...], index: tuple[sympy.Expr, ...]) -> sympy.Expr:
    position, stride = sympy.Integer(0), sympy.Integer(1)
    for i, s in reversed(list(zip(index, size))):
        position, stride = position + i * stride, stride * s
    return position


@register_lowering(torch.ops.kiln.philox_dropout.default)
def philox_dropout(x: TensorValue, seed: TensorValue, p: float) -> tuple[TensorValue, TensorValue]:
    size = tuple(x.size)

    def keep(index):
        number = ops.rand(seed.loader(()), ops.index_expr(_position(size, index), torch.int64))
        return ops.ge(number, ops.constant(p, torch.float32))

    def output(index):
        value = ops.to_dtype(x.loader(index), torch.float32)  # (as eager: 16-bit floats scaled in float32)
        scaled = ops.mul(value, ops.constant(1.0 / (1.0 - p), torch.float32))
        return ops.to_dtype(ops.where(keep(index), scaled, ops.constant(0.0, torch.float32)), x.dtype)

    return TensorValue(size, x.dtype, output), TensorValue(size, torch.bool, keep)
