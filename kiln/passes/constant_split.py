"""Freezing's split: a graph with frozen inputs cut in two, what the frozen inputs alone decide
and the rest (the `ConstantSplit` of kiln/ir/constant_split.py).

    constants graph:  (*frozen inputs) -> (*constants)          run once, and again on change
    runtime graph:    (*other inputs, *constants) -> outputs    compiled, run on every call

A constant is a value the runtime graph reads that is computed from frozen inputs only
(kiln/passes/constants.py): a folded convolution weight, a transposed or cast weight, a position
table, or a frozen input itself. Every constant is a fresh tensor object owned by kiln (a frozen
input is handed on as an alias), so what the runtime keeps on it (a packed weight) never lands on
the user's parameters.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.ir.constant_split import ConstantSplit
from kiln.passes.constants import constant_nodes, is_frozen_placeholder

aten = torch.ops.aten


def _read_by_runtime(gm: fx.GraphModule, constant: set[fx.Node]) -> list[fx.Node]:
    boundary = []
    for node in gm.graph.nodes:
        if node in constant and node.op != "get_attr" and any(u not in constant for u in node.users):
            boundary.append(node)
    return boundary


def _constants_graph(gm: fx.GraphModule, constant: set[fx.Node], frozen: list[fx.Node], boundary: list[fx.Node]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in frozen:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in gm.graph.nodes:
        if node in constant and node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    outputs = []
    for node in boundary:
        value = env[node]
        if node.op == "placeholder" or node.op == "get_attr":
            value = graph.call_function(aten.alias.default, (value,))
            value.meta["val"] = node.meta.get("val")
        outputs.append(value)
    graph.output(tuple(outputs))
    return fx.GraphModule(gm, graph)


def _runtime_graph(gm: fx.GraphModule, constant: set[fx.Node], boundary: list[fx.Node]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" and not is_frozen_placeholder(node):
            env[node] = graph.node_copy(node)
    for node in boundary:
        env[node] = graph.placeholder(f"constant_{node.name}")
        env[node].meta["val"] = node.meta.get("val")
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in env:
            continue
        if node.op == "output":
            # A constant returned as is would let the caller write into kiln's copy: return a clone.
            outputs = pytree.tree_map_only(fx.Node, lambda n: _clone_if_constant(graph, env[n], n in boundary), node.args[0])
            graph.output(outputs)
        elif node not in constant or node.op == "get_attr":
            env[node] = graph.node_copy(node, lambda n: env[n])
    return fx.GraphModule(gm, graph)


def _clone_if_constant(graph: fx.Graph, node: fx.Node, constant: bool) -> fx.Node:
    if not constant or not isinstance(node.meta.get("val"), torch.Tensor):
        return node
    clone = graph.call_function(aten.clone.default, (node,))
    clone.meta["val"] = node.meta["val"]
    return clone


def _computed(node: fx.Node, frozen: list[fx.Node]) -> bool:
    val = node.meta.get("val")
    if node.op in ("placeholder", "get_attr") or not isinstance(val, torch.Tensor):
        return False
    try:
        storage = val.untyped_storage()
        return not any(storage._cdata == f.meta["val"].untyped_storage()._cdata for f in frozen)
    except Exception:  # noqa: BLE001 - a fake tensor without storage identity: count it
        return True


def split_constants(gm: fx.GraphModule) -> ConstantSplit | None:
    """The two graphs, or None when no runtime value depends on a frozen input."""
    constant = constant_nodes(gm)
    frozen = [n for n in gm.graph.nodes if is_frozen_placeholder(n)]
    boundary = _read_by_runtime(gm, constant)
    if not frozen or not boundary:
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return ConstantSplit(
        constants=_constants_graph(gm, constant, frozen, boundary),
        runtime=_runtime_graph(gm, constant, boundary),
        frozen_positions=[i for i, n in enumerate(placeholders) if is_frozen_placeholder(n)],
        runtime_positions=[i for i, n in enumerate(placeholders) if not is_frozen_placeholder(n)],
        computed=[_computed(n, frozen) for n in boundary],
    )
