"""GPU convolutions in channels-last, their bias added in the kernel that reads their output.

On a GPU, cuDNN's bfloat16 and float16 convolutions run on tensor cores in the NHWC layout; given
NCHW tensors they transpose around the convolution or pick slower kernels. ATen's convolution
returns channels-last data when its weight is channels-last, so a frozen weight is made
channels-last once (the clone is a constant: the constants graph computes it, kiln/runtime/frozen.py)
and every value computed from the convolution's output follows (`refresh_meta`): the kernels
between convolutions read and write channels-last, and the next convolution gets it without a
copy. What the graph returns keeps eager's layout.

ATen adds a convolution's bias as a second pass over the output after cuDNN's kernel. Where every
reader of the output is an op kiln lowers into loops (a folded BatchNorm's ReLU, a residual add),
the bias becomes an add in their kernel instead, as `bias_epilogue` does for `addmm`.

It rewrites graphs for code generators whose traits ask for it (`channels_last_convolutions`,
kiln/ir/target.py): Triton's, on GPU graphs and on the CPU graphs of `KILN_CODEGEN=triton`, whose
kernels run under Triton's interpreter (how CI runs it end to end). C++ graphs are left to
conv_prepack (oneDNN's own layouts and post-ops).
"""

from __future__ import annotations

import torch
from torch import fx

from kiln.ir.target import Target
from kiln.passes.bias_epilogue import consumers_are_lowered
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.fake_values import refresh_meta
from kiln.passes.pattern import insert

aten = torch.ops.aten


def _convolutions(gm: fx.GraphModule) -> list[fx.Node]:
    """2-d convolutions (not transposed) with plain, static shapes."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.convolution.default or len(node.args) != 9:
            continue
        weight, transposed = node.args[1].meta.get("val"), node.args[6]
        if isinstance(weight, torch.Tensor) and weight.dim() == 4 and not transposed:
            found.append(node)
    return found


def _channels_last_weight(gm: fx.GraphModule, conv: fx.Node, constants: ConstantSet) -> bool:
    weight = conv.args[1]
    if weight not in constants or weight.meta["val"].is_contiguous(memory_format=torch.channels_last):
        return False
    last = insert(gm, conv, aten.clone.default, weight, memory_format=torch.channels_last)
    constants.add(last)
    conv.update_arg(1, last)
    return True


def _bias_in_consumers(gm: fx.GraphModule, conv: fx.Node, target: Target) -> bool:
    bias = conv.args[2]
    if bias is None or not consumers_are_lowered(conv, target.loop_ops):
        return False
    without = insert(gm, conv, aten.convolution.default, *conv.args[:2], None, *conv.args[3:])
    shaped = insert(gm, conv, aten.view.default, bias, [-1, 1, 1])
    total = insert(gm, conv, aten.add.Tensor, without, shaped)
    conv.replace_all_uses_with(total)
    gm.graph.erase_node(conv)
    return True


def conv_layout(gm: fx.GraphModule, target: Target) -> bool:
    if not target.codegen.channels_last_convolutions:
        return False
    convolutions = _convolutions(gm)
    constants = ConstantSet(gm) if has_frozen_inputs(gm) else ConstantSet.empty()
    changed = False
    for conv in convolutions:
        changed |= _channels_last_weight(gm, conv, constants)
    for conv in convolutions:
        changed |= _bias_in_consumers(gm, conv, target)
    if changed:
        refresh_meta(gm)
    return changed
