"""`addmm(bias, x, w)` -> `mm(x, w) + bias` when the bias add can join a kernel.

ATen's addmm first copies the broadcast bias into its output and then accumulates the product
into it: a full extra pass over the output (a fifth of BertModel's time on CPU). When every
consumer of the result, looked through views, is an op kiln lowers into loops (`target.loop_ops`), the add becomes
part of the consumer's kernel (GELU, residual add + layer norm) and costs nothing. When a
consumer is itself an extern (a matmul, attention), addmm stays; on a GPU also when it is one
through a split (q, k and v of one product, read by SDPA).
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from kiln.ir.target import Target

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.expand.default,
          aten.slice.Tensor, aten.select.int, aten.t.default, aten.transpose.int}


# Ops that return several views of their input (a fused q/k/v product split in three), read
# through `getitem`s.
_SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, operator.getitem}


def consumers_are_lowered(node: fx.Node, loop_ops: frozenset, through_splits: bool = False) -> bool:
    """Every reader of `node`, looked through views (and splits, with `through_splits`), is an op
    kiln lowers into loops."""
    for user in node.users:
        if user.op != "call_function":
            return False
        if user.target in _VIEWS or (through_splits and user.target in _SPLITS):
            if not consumers_are_lowered(user, loop_ops, through_splits):
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
        # On a GPU a split is looked through (it is a loop op, so it alone would take the bias):
        # GPT-2's q/k/v product, read only by SDPA, keeps its bias in cuBLAS's addmm (added in its
        # epilogue) and SDPA reads q, k and v where the product wrote them, as in eager; split
        # off, the add was a kernel a layer writing three copies. The CPU keeps splitting it (its
        # attention reads q, k and v contiguous per head; not timed the other way).
        through_splits = target.device != "cpu"
        if len(node.args) > 3 or not consumers_are_lowered(node, target.loop_ops, through_splits):
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
