"""Products that read the same input become one, over their constant weights concatenated.

An attention's q, k and v projections and a gated MLP's gate and up each multiply the same
activation by a different frozen weight. At a decode step's one row a product is one pass over its
weight: three calls over a third of the bytes each paid the call's fixed cost and a parallel
region of their own three times, and a 768 x 768 weight streamed at 24 GB/s where one of
768 x 2304 streams at 28 (2-core Intel Xeon, 2 threads). So the weights are concatenated along
the output features (once, as constants: split_constants computes them at freezing) and one
product's output is sliced, each former product taking its columns:

    mm(view(x, s), w1), mm(view(x, s), w2)  ->  y = mm(view(x, s), cat([w1, w2], 1));  y[:, :n1], y[:, n1:]
    addmm(b1, x, w1), addmm(b2, x, w2)      ->  y = addmm(cat([b1, b2]), x, cat([w1, w2], 1));  slices

Each output column is the same dot product over the same row as before.
kiln.quantize's Linear layers merge the same way (quantized_gemm.py), their scales and zero
points concatenated with their weights.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable

import torch
from torch import fx

from kiln import logs
from kiln.ir.target import Target
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.pattern import arguments, insert

aten = torch.ops.aten

# (first sibling, all siblings) -> the merged product, inserted before the first.
MergedOf = Callable[[fx.Node, list[fx.Node]], fx.Node]


def merge_siblings(gm: fx.GraphModule, constants: ConstantSet, groups: Iterable[list[fx.Node]], merged_of: MergedOf,
                   what: str) -> bool:
    """Each group of two or more products (in graph order, reading the same input, their other
    operands constants) replaced by `merged_of`'s one product and a slice of its last dimension
    each; a product whose value is an output of the graph stays apart. The constants a later
    sibling reads are moved before the first (they depend on nothing else), where the merged
    product goes."""
    changed = False
    for group in groups:
        siblings = [n for n in group if not _escapes(n)]
        if len(siblings) < 2:
            continue
        first = siblings[0]
        if not all(_hoist(gm, first, w, constants) for n in siblings[1:] for w in n.all_input_nodes if w in constants):
            continue
        merged = merged_of(first, siblings)
        start, parts = 0, []
        for node in siblings:
            width = node.meta["val"].shape[-1]
            parts.append(insert(gm, first, aten.slice.Tensor, merged, -1, start, start + width))
            start += width
        # (erased once every slice is in: a node put before an erased one is lost from the graph
        # when the sibling after that one is erased, where the two were neighbours)
        for node, part in zip(siblings, parts):
            node.replace_all_uses_with(part)
            gm.graph.erase_node(node)
        logs.log("freezing", "%s: one %s of %d siblings (%d output features)", merged.name, what, len(siblings), start)
        changed = True
    return changed


_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default, aten.t.default,
          aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.slice.Tensor,
          aten.expand.default, aten.alias.default, aten.as_strided.default, aten.select.int}


def _escapes(node: fx.Node) -> bool:
    """Whether the product's value, or a view of it, is an output of the graph: a slice of the
    merged product would reach the user with other strides than eager's contiguous tensor."""
    pending, seen = [node], {node}
    while pending:
        for user in pending.pop().users:
            if user.op == "output":
                return True
            if user.target in _VIEWS and user not in seen:
                seen.add(user)
                pending.append(user)
    return False


def concatenated(gm: fx.GraphModule, before: fx.Node, constants: ConstantSet, parts: list, dim: int) -> fx.Node | None:
    """`cat(parts, dim)` before `before`, a constant (None when the parts are None: no biases)."""
    if parts[0] is None:
        return None
    node = insert(gm, before, aten.cat.default, parts, dim)
    constants.add(node)
    return node


def _hoist(gm: fx.GraphModule, first: fx.Node, node: fx.Node, constants: ConstantSet) -> bool:
    """Make constant `node` come before `first`, moving it and the constants it is computed from;
    False (nothing moved) when it reads a node that is not a constant."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    if order[node] < order[first]:
        return True
    chain, pending = [], [node]
    while pending:
        current = pending.pop()
        if order[current] < order[first] or current in chain:
            continue
        if current.op != "call_function" or current not in constants:
            return False
        chain.append(current)
        pending.extend(current.all_input_nodes)
    for current in sorted(chain, key=order.__getitem__):
        first.prepend(current)
    return True


def _float_groups(gm: fx.GraphModule, constants: ConstantSet) -> list[list[fx.Node]]:
    """The float products (`mm`, `addmm` with beta = alpha = 1) of a constant weight, grouped by
    the input they read (a `view` of one tensor to one shape counts as the same input), their
    dtype and whether they add a constant bias."""
    groups: dict[Hashable, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        key = _float_key(node, constants)
        if key is not None:
            groups.setdefault(key, []).append(node)
    return list(groups.values())


def _float_key(node: fx.Node, constants: ConstantSet) -> Hashable | None:
    if node.op != "call_function":
        return None
    if node.target is aten.mm.default:
        (a, b), bias = arguments(node), None
    elif node.target is aten.addmm.default:
        bias, a, b, beta, alpha = arguments(node)
        if beta != 1 or alpha != 1 or bias not in constants or bias.meta["val"].dim() != 1:
            return None
    else:
        return None
    va, vb = a.meta.get("val"), b.meta.get("val")
    if b not in constants or not isinstance(va, torch.Tensor) or va.dtype not in (torch.float32, torch.bfloat16) \
            or not all(isinstance(s, int) for s in vb.shape):
        return None
    source = a
    if a.target is aten.view.default:  # (each Linear views the activation to 2-D on its own)
        source, shape = arguments(a)
        return ("view", source, tuple(shape), vb.shape[0], va.dtype, bias is None)
    return ("node", source, vb.shape[0], va.dtype, bias is None)


def _weight(node: fx.Node) -> fx.Node:
    return arguments(node)[1 if node.target is aten.mm.default else 2]


def _merged_float_product(gm: fx.GraphModule, constants: ConstantSet) -> MergedOf:
    def merged_of(first: fx.Node, siblings: list[fx.Node]) -> fx.Node:
        weights = concatenated(gm, first, constants, [_weight(n) for n in siblings], 1)
        if first.target is aten.mm.default:
            return insert(gm, first, aten.mm.default, arguments(first)[0], weights)
        bias = concatenated(gm, first, constants, [arguments(n)[0] for n in siblings], 0)
        return insert(gm, first, aten.addmm.default, bias, arguments(first)[1], weights)
    return merged_of


def sibling_products(gm: fx.GraphModule, target: Target) -> bool:
    """The pass: float products of frozen weights that read the same input, merged (CPU)."""
    if target.device != "cpu" or not has_frozen_inputs(gm):
        return False
    constants = ConstantSet(gm)
    return merge_siblings(gm, constants, _float_groups(gm, constants), _merged_float_product(gm, constants), "product")
