"""2-d max pooling as generated code: each output element the maximum over its window, the window
unrolled in the loader (ResNet's and RegNet's 3x3 stride-2 stem pool); any stride, padding,
dilation and ceil mode, windows of up to MAX_WINDOW elements, static spatial sizes.

Eager's `max_pool2d_with_indices` also writes an int64 index per output; in inference nothing
reads it, and a loader that is never realized costs nothing, so only the values are computed
there. Where the indices are used (training's backward) they follow ATen's CPU rule: the first
position in the window (row by row) holding the maximum, a NaN taking the place of any number.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch

from kiln.ir.indexing import FloorDiv
from kiln.ir.ops import ops
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue

aten = torch.ops.aten
MAX_WINDOW = 49  # elements per window unrolled into one loader; larger windows stay ATen's


def _pair(values: Sequence[int] | int, name: str) -> tuple[int, int]:
    values = [values] if isinstance(values, int) else list(values)
    if len(values) not in (1, 2):
        raise NotImplementedError(f"max_pool2d {name} of {len(values)} entries")
    return (values[0], values[-1])


def _output_length(length: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """ATen's pooling_output_shape: in ceil mode the last window must start inside the input or
    its left padding."""
    out = (length + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= length + pad:
        out -= 1
    return out


@register_lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (),
                            padding: Sequence[int] | int = 0, dilation: Sequence[int] | int = 1,
                            ceil_mode: bool = False) -> tuple[TensorValue, TensorValue]:
    kernel = _pair(kernel_size, "kernel_size")
    step = _pair(stride, "stride") if stride else kernel
    pad, dilate = _pair(padding, "padding"), _pair(dilation, "dilation")
    if kernel[0] * kernel[1] > MAX_WINDOW:
        raise NotImplementedError(f"max_pool2d window of {kernel[0] * kernel[1]} elements")
    if not all(isinstance(s, sympy.Integer) for s in x.size[-2:]) or x.dtype not in (torch.float32, torch.bfloat16,
                                                                                      torch.float16, torch.float64):
        raise NotImplementedError("max_pool2d of symbolic spatial sizes or a non-float dtype")
    height, width = int(x.size[-2]), int(x.size[-1])
    out = (_output_length(height, kernel[0], step[0], pad[0], dilate[0], ceil_mode),
           _output_length(width, kernel[1], step[1], pad[1], dilate[1], ceil_mode))
    # Padding, or a ceil-mode window past the input's end: some window elements are outside.
    partial = pad != (0, 0) or ceil_mode
    size = (*x.size[:-2], sympy.Integer(out[0]), sympy.Integer(out[1]))

    def window(index: Any) -> list[tuple[Any, Any, sympy.Expr]]:
        """(in bounds, value, flat position h * width + w) of each element of the window."""
        *outer, oh, ow = index
        elements = []
        for kh in range(kernel[0]):
            for kw in range(kernel[1]):
                h, w = oh * step[0] - pad[0] + kh * dilate[0], ow * step[1] - pad[1] + kw * dilate[1]
                checks = [ops.ge(ops.index_expr(h, torch.int64), ops.constant(0, torch.int64)),
                          ops.lt(ops.index_expr(h, torch.int64), ops.constant(height, torch.int64)),
                          ops.ge(ops.index_expr(w, torch.int64), ops.constant(0, torch.int64)),
                          ops.lt(ops.index_expr(w, torch.int64), ops.constant(width, torch.int64))]
                inside = checks[0]
                for check in checks[1:]:
                    inside = ops.logical_and(inside, check)
                clamped = [sympy.Min(sympy.Max(h, 0), height - 1), sympy.Min(sympy.Max(w, 0), width - 1)]
                elements.append((inside, x.loader([*outer, *clamped]), h * width + w))
        return elements

    def values(index: Any) -> Any:
        best, lowest = None, ops.constant(-math.inf, x.dtype)
        for inside, value, _ in window(index):
            value = ops.where(inside, value, lowest) if partial else value
            best = value if best is None else ops.maximum(best, value)  # a NaN wins, as in eager
        return best

    def indices(index: Any) -> Any:
        *_, oh, ow = index
        # ATen's start: the window's first row (column) at or after 0, in steps of the dilation.
        first_h, first_w = (start + d * FloorDiv(sympy.Max(-start, 0) + d - 1, d)
                            for start, d in ((oh * step[0] - pad[0], dilate[0]), (ow * step[1] - pad[1], dilate[1])))
        best_value, best_index = ops.constant(-math.inf, x.dtype), ops.index_expr(first_h * width + first_w, torch.int64)
        for inside, value, position in window(index):
            take = ops.logical_and(inside, ops.logical_or(ops.gt(value, best_value), ops.ne(value, value)))
            best_value = ops.where(take, value, best_value)
            best_index = ops.where(take, ops.index_expr(position, torch.int64), best_index)
        return best_index

    return TensorValue(size, x.dtype, values), TensorValue(size, torch.int64, indices)
