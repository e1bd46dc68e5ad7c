"""A minifier candidate: some of a graph's op nodes, cut out as a graph of their own.

    values = intermediate_values(gm, inputs)           # every node's eager value, once
    small, small_inputs = cut_out(gm, keep, values)     # keep: a set of gm's op nodes

The kept nodes are copied in order. A value a kept node reads from a node left out becomes a
placeholder of the new graph, fed with that node's eager value, so a failure that depends on the
values (an accuracy failure, a NaN) still shows; a value that is not a tensor (a size, a dtype) is
written into the node as a literal. The outputs are the kept nodes whose values a left-out node or
the original output reads. Constants (get_attr) follow the kept nodes that read them, under flat
names on a new root module, so the graph prints as code that a repro can define.
"""

from __future__ import annotations

import enum
from typing import Any, Collection, Sequence

import torch
from torch import fx

# The nodes a candidate keeps or drops; placeholders and constants only follow them.
OPS = ("call_function", "call_method", "call_module")
_LITERALS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout,
             enum.Enum, slice, type(Ellipsis))


class NotCuttable(Exception):
    """This set of nodes cannot stand alone: a left-out value it reads is neither a tensor nor a
    literal (a tuple of tensors, say), or it has no tensor output."""


def op_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes that compute, in graph order: what a candidate chooses among."""
    return [n for n in gm.graph.nodes if n.op in OPS]


class _Inliner(fx.Tracer):
    def is_leaf_module(self, module: torch.nn.Module, qualified_name: str) -> bool:
        return False


def without_modules(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` with every call_module node traced through into the functions it calls: a repro
    cannot define the user's module classes, and a candidate keeps or drops single ops.

    Example::

        without_modules(fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4))))  # linear as a call_function
    """
    if not any(n.op == "call_module" for n in gm.graph.nodes):
        return gm
    return fx.GraphModule(gm, _Inliner().trace(gm))


def intermediate_values(gm: fx.GraphModule, inputs: Sequence[Any]) -> dict[fx.Node, Any]:
    """Every node's value when `gm` runs eagerly on `inputs`, as it was when computed (constants: the
    attribute itself).

    Example::

        values = intermediate_values(gm, [torch.randn(4)])
        values[next(iter(gm.graph.nodes))]   # the first input
    """
    values: dict[fx.Node, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node: fx.Node) -> Any:
            value = super().run_node(node)
            # A copy: an in-place op later in the graph must not change what this node gave.
            values[node] = value.clone() if isinstance(value, torch.Tensor) and node.op != "get_attr" else value
            return value

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return values


def _is_literal(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_literal(v) for v in value)
    return isinstance(value, _LITERALS)


def _holds_tensors(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or (isinstance(value, (tuple, list)) and value != []
                                               and all(isinstance(v, torch.Tensor) for v in value))


def cut_out(gm: fx.GraphModule, keep: Collection[fx.Node], values: dict[fx.Node, Any]) -> tuple[fx.GraphModule, list]:
    """The graph of the op nodes `keep` of `gm` and the inputs to run it with (module docstring).

    Example::

        small, small_inputs = cut_out(gm, op_nodes(gm)[10:12], intermediate_values(gm, inputs))
    """
    keep = set(keep)
    graph, root = fx.Graph(), torch.nn.Module()
    env: dict[fx.Node, Any] = {}
    inputs: list = []
    read = list(dict.fromkeys(a for n in gm.graph.nodes if n in keep for a in n.all_input_nodes if a not in keep))
    # Placeholders first, in the order the kept nodes read them: a forward's arguments before its body.
    for node in read:
        if node.op != "get_attr" and isinstance(values[node], torch.Tensor):
            env[node] = graph.placeholder(node.name)
            inputs.append(values[node])
    for node in read:
        if node in env:
            continue
        if node.op == "get_attr":
            env[node] = _constant(graph, root, node, values[node])
        elif _is_literal(values[node]):
            env[node] = values[node]
        else:
            raise NotCuttable(f"{node.name} gives a {type(values[node]).__name__}, which a graph input cannot be")
    outputs = []
    for node in gm.graph.nodes:
        if node not in keep:
            continue
        env[node] = graph.node_copy(node, lambda arg: env[arg])
        if any(user not in keep for user in node.users) and _holds_tensors(values[node]):
            outputs.append(env[node])
    if not outputs:
        raise NotCuttable("none of the kept nodes gives a tensor that the rest of the graph reads")
    graph.output(tuple(outputs))
    graph.lint()
    return fx.GraphModule(root, graph), inputs


def _constant(graph: fx.Graph, root: torch.nn.Module, node: fx.Node, value: Any) -> fx.Node:
    """A get_attr node of `graph` for `gm`'s constant `node`, held by `root` under a flat name."""
    name = node.target.replace(".", "_")
    if isinstance(value, torch.nn.Parameter):
        root.register_parameter(name, torch.nn.Parameter(value.detach(), requires_grad=value.requires_grad))
    elif isinstance(value, torch.Tensor):
        root.register_buffer(name, value.detach())
    else:
        setattr(root, name, value)
    return graph.get_attr(name)

