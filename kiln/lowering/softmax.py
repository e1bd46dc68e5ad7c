"""Softmax and log-softmax along one dim: the row max and the sum of exponentials realized, then
one pointwise pass (low-precision inputs compute in float32).

The input is read by all three passes. Inlined, each pass computes it again, which is free for
BERT's `scores / scale + mask` but not for DeBERTa-v2's scores, which add two gathers of the
relative-position products (one of them transposed, so every lane loads its own cache line): such
an input is stored once and the passes read it (the scheduler keeps the store in the same loop
nest as the max)."""

from __future__ import annotations

import torch

from kiln.ir.ops import ops
from kiln.lowering.context import realize
from kiln.lowering.pointwise import pointwise
from kiln.lowering.realize import costly_to_read_again
from kiln.lowering.reductions import reduce
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue, as_dtype

aten = torch.ops.aten


def _stable_parts(x: TensorValue, dim: int, half_to_float: bool) -> tuple[TensorValue, TensorValue, TensorValue, torch.dtype]:
    """(x in the compute dtype, its max along dim, the sum of exp(x - max)), and the output dtype."""
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"softmax of {x.dtype}")
    low = x.dtype in (torch.float16, torch.bfloat16)
    xc = as_dtype(x, torch.float32 if low else x.dtype)
    if costly_to_read_again(xc):
        xc = realize(xc)
    out_dtype = torch.float32 if half_to_float and low else x.dtype
    top = realize(reduce("max", xc, [dim], keepdim=True))
    total = realize(reduce("sum", pointwise(lambda v, m: ops.exp(ops.sub(v, m)), [xc, top]), [dim], keepdim=True))
    return xc, top, total, out_dtype


@register_lowering(aten._softmax.default)
def softmax(x: TensorValue, dim: int, half_to_float: bool) -> TensorValue:
    xc, top, total, out_dtype = _stable_parts(x, dim, half_to_float)
    return as_dtype(pointwise(lambda v, m, s: ops.truediv(ops.exp(ops.sub(v, m)), s), [xc, top, total]), out_dtype)


@register_lowering(aten._log_softmax.default)
def log_softmax(x: TensorValue, dim: int, half_to_float: bool) -> TensorValue:
    xc, top, total, out_dtype = _stable_parts(x, dim, half_to_float)
    return as_dtype(pointwise(lambda v, m, s: ops.sub(ops.sub(v, m), ops.log(s)), [xc, top, total]), out_dtype)
