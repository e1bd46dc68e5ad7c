"""Which values of a graph are constants once its frozen inputs are fixed.

The freeze pass (kiln/passes/freeze.py) marks the placeholders of the parameters and buffers it
freezes with `meta["kiln_frozen"]`. A node is constant when it is one of those, a tensor
the graph module holds, or a deterministic op whose inputs are all constant. Random ops are never
constant, and neither is a fresh tensor made from nothing that would cost much memory to keep
(a large `zeros` is cheaper to make than to store and read).
"""

from __future__ import annotations

import torch
from torch import fx

FROZEN = "kiln_frozen"
_LARGE_CREATION = 1 << 20  # elements: bigger creations from nothing stay in the runtime graph


def is_frozen_placeholder(node: fx.Node) -> bool:
    return node.op == "placeholder" and bool(node.meta.get(FROZEN))


def has_frozen_inputs(gm: fx.GraphModule) -> bool:
    return any(is_frozen_placeholder(n) for n in gm.graph.nodes)


def unmark_frozen(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        node.meta.pop(FROZEN, None)


def _numel(node: fx.Node) -> int:
    val = node.meta.get("val")
    return val.numel() if isinstance(val, torch.Tensor) else 0


def _deterministic(node: fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags and torch.Tag.inplace_view not in tags and \
        not getattr(getattr(node.target, "_schema", None), "is_mutable", False)


def constant_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """Every node whose value is fixed by the frozen inputs, in graph order."""
    constant: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" or is_frozen_placeholder(node):
            constant.add(node)
        elif node.op == "call_function" and _deterministic(node):
            inputs = node.all_input_nodes
            if inputs and all(n in constant for n in inputs):
                constant.add(node)
            elif not inputs and isinstance(node.meta.get("val"), torch.Tensor) and _numel(node) <= _LARGE_CREATION:
                constant.add(node)
    return constant


class ConstantSet:
    """`constant_nodes` kept current while a pass adds nodes computed from constants."""

    def __init__(self, gm: fx.GraphModule | None) -> None:
        self.nodes = constant_nodes(gm) if gm is not None else set()

    @classmethod
    def empty(cls) -> "ConstantSet":
        """No constants (a graph without frozen inputs: training, or freezing off)."""
        return cls(None)

    def __contains__(self, value: object) -> bool:
        return isinstance(value, fx.Node) and value in self.nodes

    def add(self, node: fx.Node) -> None:
        self.nodes.add(node)

    def all(self, *values: object) -> bool:
        """Every argument is a constant node or a plain value (None counts)."""
        return all(v in self or not isinstance(v, fx.Node) for v in values)
