"""`y + index_put(zeros, indices, values, accumulate=True)` -> `index_put(y, indices, values, True)`.

An embedding's backward is a zero table with each row's gradients added in. When the weight
has a second use (tied input and output embeddings, T5's encoder and decoder sharing one table),
autograd adds that other gradient to it: a pass over the whole table, into fresh memory, after a
pass that zeroed another. Accumulating the rows straight into the other gradient does neither;
when that gradient dies there, the scatter writes over it in place (kiln/schedule/inplace.py).
The sum is the same up to the order of float additions.
"""

from __future__ import annotations

import torch
from torch import fx

from kiln.ir.target import Target

aten = torch.ops.aten


def _is_zeros(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is aten.zeros.default:
        return True
    return node.target is aten.full.default and len(node.args) > 1 and node.args[1] == 0


def _accumulates_into_zeros(node: fx.Node) -> bool:
    """An accumulating index_put of a zero tensor whose only reader is the add."""
    return (node.op == "call_function" and node.target is aten.index_put.default and len(node.users) == 1
            and len(node.args) == 4 and node.args[3] is True and not node.kwargs and _is_zeros(node.args[0]))


def _same_tensor_type(a: fx.Node, b: fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)
            and va.shape == vb.shape and va.dtype == vb.dtype)


def scatter_accumulate(gm: fx.GraphModule, target: Target) -> bool:
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.add.Tensor or node.kwargs:
            continue
        if len(node.args) != 2 or not all(isinstance(a, fx.Node) for a in node.args):
            continue
        # The later-computed operand is folded, so chained adds accumulate into the first table.
        for scatter, other in ((node.args[1], node.args[0]), (node.args[0], node.args[1])):
            if scatter is not other and _accumulates_into_zeros(scatter) and _same_tensor_type(other, node) \
                    and _same_tensor_type(scatter, node):
                zeros, indices, values, _ = scatter.args
                with gm.graph.inserting_before(node):
                    folded = gm.graph.call_function(aten.index_put.default, (other, indices, values, True))
                folded.meta["val"] = node.meta["val"]
                node.replace_all_uses_with(folded)
                gm.graph.erase_node(node)
                gm.graph.erase_node(scatter)
                if not zeros.users:
                    gm.graph.erase_node(zeros)
                changed = True
                break
    return changed
