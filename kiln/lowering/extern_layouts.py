"""Layouts around an ATen extern call: the layout its computed arguments are written in, and the
layout its outputs will really have.

Eager's strides (the fake tensors of the fx graph) are the best guess for an argument that kiln
computes anyway: a convolution fed channels-last data in eager (ConvNeXt's blocks) gets it here
too, and one fed contiguous data (ResNet's) stays contiguous, where oneDNN is faster for it. The
outputs' strides depend on the strides the call really gets, so they are found by running the op
on fake tensors of the realized arguments; the wrapper would otherwise copy every output whose
strides differ from the fx graph's guess.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from kiln.externs import native_ops
from kiln.ir.nodes import Buffer, Layout
from kiln.ir.sizes import size_expr


def returns_view(op: Any) -> bool | None:
    """Does `op`'s schema say its result aliases an input? None when it has no schema."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    return any(r.alias_info is not None for r in schema.returns)


def layout_of(val: torch.Tensor) -> Layout:
    """The Layout of a real, fake or meta tensor (symbolic sizes as their sympy expressions)."""
    exprs = lambda xs: tuple(size_expr(x) for x in xs)  # noqa: E731
    return Layout(exprs(val.shape), exprs(val.stride()), val.dtype, size_expr(val.storage_offset()))


def _dense(t: torch.Tensor) -> bool:
    """The elements fill a storage span of numel() exactly once: a permuted contiguous tensor."""
    expected = 1
    for stride, size in sorted((int(st), int(n)) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _static_tensor(meta: Any) -> bool:
    return isinstance(meta, torch.Tensor) and not any(isinstance(v, torch.SymInt) for v in (*meta.shape, *meta.stride()))


def argument_layout(meta: Any, size: Any, dtype: torch.dtype) -> Layout | None:
    """Eager's dense layout of an argument, or None (use contiguous) when eager's was not dense,
    or the value's size or dtype is not the argument's."""
    if not _static_tensor(meta) or meta.dtype != dtype or [int(s) for s in meta.shape] != [int(s) for s in size]:
        return None
    if meta.is_contiguous() or not _dense(meta):
        return None
    return dataclasses.replace(layout_of(meta), offset=sympy.Integer(0))


def _fake(buffer: Buffer) -> torch.Tensor:
    layout = buffer.layout
    return torch.empty_strided([int(s) for s in layout.size], [int(s) for s in layout.stride], dtype=layout.dtype)


def output_layouts(op: Any, args: tuple, kwargs: dict) -> list[Layout] | None:
    """The layouts of `op`'s tensor outputs on these realized arguments, or None when that cannot
    be known ahead (symbolic layouts, or no fake kernel)."""
    leaves = pytree.tree_leaves((args, kwargs))
    if any(isinstance(v, Buffer) and not v.layout.is_static for v in leaves):
        return None
    try:
        # Fake CPU tensors, not meta ones: fake convolution follows the CPU kernel's layout choice.
        with FakeTensorMode(allow_non_fake_inputs=True):
            fargs, fkwargs = pytree.tree_map_only(Buffer, _fake, (args, kwargs))
            out = op(*fargs, **fkwargs)
    except Exception:  # no fake kernel, or one stricter than the CPU kernel: keep eager's guess
        return None
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [layout_of(o) if isinstance(o, torch.Tensor) else None for o in outs]


def argument_metas(node: Any) -> tuple:
    """The fx arguments whose fake values give the layouts of an extern's computed arguments
    (a fake tensor in an argument's place stands for it): eager's, except that a `kiln::conv`
    running on channels-last data (every implementation but "aten") gets its input computed
    channels-last, whatever eager's layout of it was. Its wrapper would convert it otherwise, and a
    kernel that computes along the channels and stores channels-first scatters lane by lane
    (MobileViT's fold-back layer norm: 1.0 ms for 3.5 MB)."""
    if not native_ops.is_op(node.target, "conv") or not node.args:
        return node.args
    impl = node.args[11] if len(node.args) > 11 else node.kwargs.get("impl")
    x = node.args[0]
    val = x.meta.get("val") if impl != "aten" and hasattr(x, "meta") else None
    if not _static_tensor(val) or val.dim() != 4:
        return node.args
    return (val.contiguous(memory_format=torch.channels_last), *node.args[1:])
