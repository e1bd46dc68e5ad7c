"""A 2-d convolution with a frozen weight, and the pointwise ops after it, as one library call.

    relu(conv(x, w, b) + other)  ->  kiln::conv(x, w, b, ..., "relu", other=other, impl)

The post-ops oneDNN can apply inside its convolution are folded in: an added tensor of the
output's shape (a residual), then one unary op (relu, sigmoid, tanh, silu, gelu, leaky_relu,
hardtanh; hardswish when the graph has it whole, which the core-ATen table does not leave). The implementation is measured per shape with
its post-ops (kiln/autotune/gemm.py): oneDNN with the weight reordered once into its blocked
layout and data in channels-last, kiln's own kernel for depthwise convolutions (the post-ops in
its store), ATen on channels-last data, or ATen as eager runs it, in which case the graph is left
alone. A zero pad left before a depthwise convolution that kiln's kernel runs (the extra row and
column of a stride-2 "same" pad, conv_padding.py) becomes its padding, [top, left, bottom, right]:
the kernel pads inside its loops. Values after a channels-last convolution are channels-last too
(`refresh_meta`), so the kernels between convolutions write the layout the next one reads.

The layout is decided for the whole graph, not per convolution: in a graph of two or more such
convolutions, ATen's convolution in eager's layout is not a candidate. Timed alone, it can win a
close call (MobileNetV1's first convolution: 0.375 against oneDNN's 0.385 ms), but its
channels-first output then reaches the next convolutions, which read it at half their speed, and a
layout-changing pad between them: that process's call took 18.6 ms against 13.1 ms.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import fx

from kiln import logs
from kiln.autotune import mode as autotune_mode
from kiln.autotune.gemm import choose_conv
from kiln.externs import kiln_depthwise, native_ops
from kiln.ir.target import Target
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.conv_padding import padding_inside
from kiln.passes.fake_values import refresh_meta
from kiln.passes.pattern import Op, Var, arguments, insert, matches, remove_dead
from kiln.passes.post_ops import NO_POST_OP, PostOp, only_user, unary_after

aten = torch.ops.aten

_CONV = Op(aten.convolution.default, Var("x"), Var("w"), Var("b"), Var("stride"), Var("padding"), Var("dilation"),
           False, Var("output_padding"), Var("groups"))


def _residual(conv: fx.Node, add: fx.Node | None) -> fx.Node | None:
    """The tensor added to the convolution's output, when `add` is such an add."""
    if add is None or add.target is not aten.add.Tensor:
        return None
    args = arguments(add)
    if len(args) != 3 or args[2] != 1:
        return None
    other = args[1] if args[0] is conv else args[0] if args[1] is conv else None
    if not isinstance(other, fx.Node) or other is conv:
        return None
    vo, vc = other.meta.get("val"), conv.meta.get("val")
    same = isinstance(vo, torch.Tensor) and vo.shape == vc.shape and vo.dtype == vc.dtype
    return other if same else None


def _post_ops(conv: fx.Node) -> tuple[fx.Node, fx.Node | None, PostOp]:
    """The last node of the fusable chain after `conv`, the added tensor, the unary post-op."""
    add = only_user(conv)
    other = _residual(conv, add)
    last = add if other is not None else conv
    unary = unary_after(last)
    return (unary[0], other, unary[1]) if unary is not None else (last, other, NO_POST_OP)


def _static_float(*nodes: fx.Node) -> bool:
    vals = [n.meta.get("val") for n in nodes]
    return all(isinstance(v, torch.Tensor) and v.dtype in (torch.float32, torch.bfloat16)
               and all(isinstance(s, int) for s in (*v.shape, *v.stride())) for v in vals)


def _descendants(node: fx.Node, into: set[fx.Node]) -> None:
    """`node` and everything computed from it, added to `into`."""
    into.add(node)
    pending = [node]
    while pending:
        for user in pending.pop().users:
            if user not in into:
                into.add(user)
                pending.append(user)


def _per_dimension(values: Sequence[int]) -> list[int]:
    """A convolution's stride, padding or dilation with one entry per spatial dimension: ATen takes
    one entry for both (EfficientNet's convolutions padded `[0]`); kiln::conv wants two."""
    return list(values) * 2 if len(values) == 1 else list(values)


def _rewritable(found: dict, constants: ConstantSet) -> bool:
    """A 2-d float convolution of static sizes with a frozen weight (and bias), not transposed."""
    x, w, b = found["x"], found["w"], found["b"]
    return (w in constants and constants.all(b) and w.meta["val"].dim() == 4 and _static_float(x, w)
            and not any(found["output_padding"]))


def conv_prepack(gm: fx.GraphModule, target: Target) -> bool:
    mode = autotune_mode()
    if target.device != "cpu" or not has_frozen_inputs(gm):
        return False
    constants = ConstantSet(gm)
    # Values computed from a rewritten convolution's channels-last output: their fake values
    # (eager's layout) are stale until refresh_meta, and ATen's convolution on them is slow.
    channels_last: set[fx.Node] = set()
    changed = False
    # Counted before any rewrite; matched again while rewriting, since a rewrite replaces the
    # nodes a later match would hold (the next convolution's input).
    count = sum(_rewritable(found, constants) for _, found in matches(gm, _CONV))
    for conv, found in matches(gm, _CONV):
        if not _rewritable(found, constants):
            continue
        x, w, b = found["x"], found["w"], found["b"]
        last, other, (unary, scalars, algorithm) = _post_ops(conv)
        stride, padding, dilation = (_per_dimension(found[k]) for k in ("stride", "padding", "dilation"))
        conv_args = (stride, padding, dilation, found["groups"])
        if mode == "off":
            impl = "onednn"
        else:
            impl = choose_conv(x.meta["val"], x in channels_last, w.meta["val"], b.meta["val"] if b is not None else None,
                               conv_args, unary, scalars, algorithm or None,
                               other.meta["val"] if other is not None else None, mode,
                               channels_last_only=count > 1)
        logs.log("freezing", "%s %s w%s +%s %s: %s", conv.name, tuple(x.meta["val"].shape), tuple(w.meta["val"].shape),
                 "residual" if other is not None else "", unary, impl)
        if impl == "aten":
            continue
        if impl.startswith("aten"):  # ATen on channels-last data: the post-ops stay kiln's kernels
            last, other, (unary, scalars, algorithm) = conv, None, NO_POST_OP
        inside = padding_inside(x, padding) if impl == "kiln" and kiln_depthwise.applies(
            x.meta["val"], w.meta["val"], found["groups"]) else None
        if inside is not None:  # kiln's depthwise kernel pads inside its loops, on each side its own
            x, conv_args = inside[0], (conv_args[0], inside[1], *conv_args[2:])
        fused = insert(gm, last, native_ops.op("conv"), x, w, b, *conv_args, unary, scalars, algorithm or None,
                       other, impl)
        last.replace_all_uses_with(fused)
        remove_dead(gm, [last])
        _descendants(fused, channels_last)
        changed = True
    if changed:
        refresh_meta(gm)
    return changed
