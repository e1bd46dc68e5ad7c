"""Tensors made from nothing but their size: constants and ranges, computed where they are read."""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch

from kiln.ir.ops import ops
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue

aten, prims = torch.ops.aten, torch.ops.prims


def _on_cpu(device: Any, layout: Any = None) -> None:
    if device is not None and torch.device(device).type != "cpu" or layout not in (None, torch.strided):
        raise NotImplementedError("a tensor created on another device or layout")  # an extern call


def _scalar_dtype(*values: Any) -> torch.dtype:
    """The dtype eager infers from Python numbers (bool, then int64, then the default float)."""
    if all(isinstance(v, bool) for v in values):
        return torch.bool
    if all(isinstance(v, (bool, int)) for v in values):
        return torch.int64
    return torch.get_default_dtype()


def filled(size: Any, value: Any, dtype: torch.dtype | None) -> TensorValue:
    dtype = dtype or _scalar_dtype(value)
    return TensorValue(tuple(sympy.sympify(s) for s in size), dtype, lambda index: ops.constant(value, dtype))


@register_lowering(aten.scalar_tensor.default)
def scalar_tensor(value: Any, *, dtype: torch.dtype | None = None, layout=None, device=None, pin_memory=None) -> TensorValue:
    _on_cpu(device, layout)
    return filled((), value, dtype or torch.get_default_dtype())


@register_lowering(aten.full.default)
def full(size: Any, value: Any, *, dtype: torch.dtype | None = None, layout=None, device=None, pin_memory=None) -> TensorValue:
    _on_cpu(device, layout)
    return filled(size, value, dtype)


@register_lowering(aten.full_like.default)
def full_like(x: TensorValue, value: Any, *, dtype: torch.dtype | None = None, layout=None, device=None,
              pin_memory=None, memory_format=None) -> TensorValue:
    _on_cpu(device, layout)
    # The graph output (if it is one) takes the layout eager chose from memory_format.
    return filled(x.size, value, dtype or x.dtype)


def _range(length: int, start: Any, step: Any, dtype: torch.dtype) -> TensorValue:
    if not dtype.is_floating_point:
        if not all(isinstance(v, int) for v in (start, step)):
            raise NotImplementedError("an integer range with fractional start or step")
        return TensorValue((sympy.Integer(length),), dtype, lambda index: ops.index_expr(start + step * index[0], dtype))

    def loader(index):  # eager computes start + step * i in double, then rounds once to the dtype
        i = ops.index_expr(index[0], torch.float64)
        value = ops.add(ops.mul(i, ops.constant(step, torch.float64)), ops.constant(start, torch.float64))
        return value if dtype == torch.float64 else ops.to_dtype(value, dtype)

    return TensorValue((sympy.Integer(length),), dtype, loader)


@register_lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: torch.dtype | None = None, layout=None,
           device=None, pin_memory=None) -> TensorValue:
    _on_cpu(device, layout)
    if end is None:
        start, end = 0, start
    if not all(isinstance(v, (int, float)) for v in (start, end, step)):
        raise NotImplementedError("arange with symbolic bounds")
    length = max(math.ceil((end - start) / step), 0)
    return _range(length, start, step, dtype or _scalar_dtype(start, end, step))


@register_lowering(prims.iota.default)
def iota(length: int, *, start: int, step: int, dtype: torch.dtype, device: Any, requires_grad: bool) -> TensorValue:
    _on_cpu(device)
    return _range(length, start, step, dtype)


# Uninitialized tensors: any contents are right, and zeros cost one store per element (nothing at
# all where a later op overwrites them before anything reads them, once fused).
@register_lowering(aten.empty.memory_format)
def empty(size: Any, *, dtype: torch.dtype | None = None, layout=None, device=None, pin_memory=None,
          memory_format=None) -> TensorValue:
    _on_cpu(device, layout)
    return filled(size, 0, dtype or torch.get_default_dtype())


@register_lowering(aten.empty_permuted.default)
def empty_permuted(size: Any, physical_layout: Any, *, dtype: torch.dtype | None = None, layout=None, device=None,
                   pin_memory=None) -> TensorValue:
    return empty(size, dtype=dtype, layout=layout, device=device)


@register_lowering(aten.new_empty_strided.default)
def new_empty_strided(x: TensorValue, size: Any, stride: Any, *, dtype: torch.dtype | None = None, layout=None,
                      device=None, pin_memory=None) -> TensorValue:
    return empty(size, dtype=dtype or x.dtype, layout=layout, device=device)
