"""`addmm(bias, x, w)` -> `mm(x, w) + bias` when the bias add can join a kernel.

ATen's addmm first copies the broadcast bias into its output and then accumulates the product
into it: a full extra pass over the output (a fifth of BertModel's time on CPU). When every
consumer of the result, looked through views, is an op kiln lowers into loops (`target.loop_ops`), the add becomes
part of the consumer's kernel (GELU, residual add + layer norm) and costs nothing. When a
consumer is itself an extern (a matmul, attention), addmm stays.
"""

from __future__ import annotations

import torch
from torch import fx

from kiln.ir.target import Target

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.expand.default,
          aten.slice.Tensor, aten.select.int, aten.t.default, aten.transpose.int}


def consumers_are_lowered(node: fx.Node, loop_ops: frozenset) -> bool:
    """Every reader of `node`, looked through views, is an op kiln lowers into loops."""
    for user in node.users:
        if user.op != "call_function":
            return False
        if user.target in _VIEWS:
            if not consumers_are_lowered(user, loop_ops):
                return False
        elif user.target not in loop_ops:
            return False
    return True


def bias_epilogue(gm: fx.GraphModule, target: Target) -> bool:
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.addmm.default or node.kwargs:
            continue
        bias, x, w = node.args[:3]
        if len(node.args) > 3 or not consumers_are_lowered(node, target.loop_ops):
            continue  # beta/alpha other than 1, or an extern reads the result
        val = node.meta.get("val")
        with gm.graph.inserting_before(node):
            product = gm.graph.call_function(aten.mm.default, (x, w))
            total = gm.graph.call_function(aten.add.Tensor, (product, bias))
        with val.fake_mode:
            product.meta["val"] = aten.mm.default(x.meta["val"], w.meta["val"])
            total.meta["val"] = aten.add.Tensor(product.meta["val"], bias.meta["val"])
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
        changed = True
    return changed
