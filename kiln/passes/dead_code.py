"""Nodes whose results nobody uses are removed, conservatively: only calls of ATen operators that
return something, mutate nothing and draw no random numbers (a dead random op still advances the
generator in eager), plus `getitem`s of such results. Error checks that return nothing
(`_linalg_check_errors`), in-place and random ops stay. fx's own elimination is not used: it
considers a check that returns nothing pure."""

from __future__ import annotations

import operator

import torch
from torch import fx

from kiln.ir.target import Target


def pure(node: fx.Node) -> bool:
    """A call of an ATen operator that returns something, mutates nothing and draws no random
    numbers, or a `getitem` of such a call's result (`cse` merges these too)."""
    if node.op != "call_function" or node.is_impure():
        return False
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    if schema is None or schema.is_mutable or not schema.returns:
        return False
    return torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ())


def _removable(node: fx.Node) -> bool:
    return not node.users and pure(node)


def dead_code(gm: fx.GraphModule, target: Target) -> bool:
    changed = False
    for node in reversed(list(gm.graph.nodes)):  # users before what they use: chains go in one sweep
        if _removable(node):
            gm.graph.erase_node(node)
            changed = True
    return changed
