"""Zero padding written as its own op, folded into the convolution that reads it.

    convolution(constant_pad_nd(x, [l1, r1, l0, r0], 0), padding=[p0, p1])
        ->  convolution(x, padding=[p0 + s0, p1 + s1]),  s = min(l, r) per spatial dim
    constant_pad_nd(x, [0, 0, ...])  ->  x

TensorFlow-style models (HuggingFace's MobileNet, EfficientNet, ...) pad before every
convolution ("same" padding); each pad is a copy of the activation, and a convolution pads for
free inside its own loops. The symmetric part of a pad goes into the convolution; what is left
(the extra row and column of a stride-2 "same" pad) stays a pad of its own, for ATen's and
oneDNN's convolutions, which pad alike on both sides; conv_prepack folds it into a `kiln::conv`
that kiln's depthwise kernel runs (`padding_inside`). A pad of nothing is
an alias of its input. Only a pad whose one reader is the convolution is folded: a pad also
returned or saved for backward stays as it is.
"""

from __future__ import annotations

import torch
from torch import fx

from kiln.ir.target import Target
from kiln.passes.pattern import insert

aten = torch.ops.aten


def _zero_pad(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.constant_pad_nd.default:
        return False
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    return value == 0 and all(isinstance(p, int) and p >= 0 for p in node.args[1])


def _fold_into(conv: fx.Node, gm: fx.GraphModule) -> bool:
    x = conv.args[0]
    if not (isinstance(x, fx.Node) and _zero_pad(x) and len(x.users) == 1) or conv.args[6]:  # transposed
        return False
    pads, padding = list(x.args[1]), list(conv.args[4])
    if len(pads) > 2 * len(padding):
        return False  # pads a batch or channel dimension
    folded, rest = list(padding), []
    for d in range(len(pads) // 2):  # pads run from the last dimension backwards, (left, right) each
        left, right = pads[2 * d], pads[2 * d + 1]
        both = min(left, right)
        folded[len(padding) - 1 - d] += both
        rest += [left - both, right - both]
    if folded == padding:
        return False
    source = insert(gm, conv, aten.constant_pad_nd.default, x.args[0], rest, 0.0) if any(rest) else x.args[0]
    conv.args = (source, *conv.args[1:4], folded, *conv.args[5:])
    gm.graph.erase_node(x)
    return True


def padding_inside(x: fx.Node, padding: list[int]) -> tuple[fx.Node, list[int]] | None:
    """The pad left before a 2-d convolution (the extra row and column of a stride-2 "same" pad) as
    the convolution's own padding, [top, left, bottom, right], and the pad's input; for a
    `kiln::conv` whose kernel pads inside its loops on each side (kiln's depthwise convolution,
    conv_prepack.py). None where `x` is no such pad."""
    if not (_zero_pad(x) and len(x.users) == 1 and len(x.args[1]) == 4 and len(padding) == 2):
        return None
    left, right, top, bottom = x.args[1]
    return x.args[0], [padding[0] + top, padding[1] + left, padding[0] + bottom, padding[1] + right]


def conv_padding(gm: fx.GraphModule, target: Target) -> bool:
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.convolution.default:
            changed |= _fold_into(node, gm)
        elif _zero_pad(node) and not any(node.args[1]) and not any(u.op == "output" for u in node.users):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            changed = True
    return changed
