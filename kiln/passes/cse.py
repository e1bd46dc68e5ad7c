"""Calls that compute the same value once: a pure ATen call whose operator and arguments are those
of an earlier call (its operands the same nodes, after earlier merges) is replaced by that call.

HuggingFace's attention turns a boolean mask into a float one in every layer (`where(mask, 0,
-inf)` before GPT-2's SDPA on ATen's CPU flash attention, and in CUDA's SDPA for a boolean mask),
so a 12-layer model computed the same mask 12 times, a kernel a layer; Inductor's graphs have it
once (AOTAutograd's CSE). Pure here: an ATen operator that returns something, mutates nothing and
draws no random numbers (what `dead_code` removes when unused), or a `getitem` of such a call's
result, and never `empty` and its kin (two of them are two buffers). Left alone: a value the graph
returns or something writes in place, directly or through a view (two outputs must stay two
tensors), and calls on either side of a write (the same operands read before and after a write
are not the same values). Floats are compared bit for bit (0.0 is not -0.0).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from kiln.ir.target import Target
from kiln.passes.dead_code import pure


def _pure(node: fx.Node) -> bool:
    """`dead_code`'s pure calls, less `empty` and its kin (each call a new buffer)."""
    return pure(node) and torch.Tag.nondeterministic_bitwise not in getattr(node.target, "tags", ())


def _writes(node: fx.Node) -> bool:
    """A call that writes memory (a mutable schema), or a side effect fx knows of outside ATen (a
    random op draws but writes no tensor: fx calls it impure, and it is only never merged)."""
    if node.op != "call_function":
        return False
    schema = getattr(node.target, "_schema", None)
    return schema.is_mutable if schema is not None else node.is_impure()


def _aliases(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.target is operator.getitem or (schema is not None and any(r.alias_info is not None for r in schema.returns))


def _written_or_returned(node: fx.Node) -> bool:
    """Something writes `node`'s value in place, or the graph returns it, directly or through a
    view of it (merged, two returned values would share memory that eager's do not)."""
    for user in node.users:
        if user.op == "output" or _writes(user) or (_aliases(user) and _written_or_returned(user)):
            return True
    return False


def _key(value: Any, merged: dict[fx.Node, fx.Node]) -> Any:
    """A hashable stand-in for an argument; raises TypeError for one that has none."""
    if isinstance(value, fx.Node):
        return ("node", merged.get(value, value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v, merged) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _key(v, merged)) for k, v in value.items())))
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError("symbolic")  # (compared by identity otherwise: left alone)
    hash(value)
    return (type(value).__name__, value)


def cse(gm: fx.GraphModule, target: Target) -> bool:
    seen: dict[Any, fx.Node] = {}
    merged: dict[fx.Node, fx.Node] = {}
    writes = 0  # calls that write so far: a key holds the count, so nothing merges across a write
    for node in list(gm.graph.nodes):
        if _writes(node):
            writes += 1
            continue
        if not _pure(node) or _written_or_returned(node):
            continue
        try:
            key = (node.target, _key(node.args, merged), _key(node.kwargs, merged), writes)
        except TypeError:
            continue
        kept = seen.setdefault(key, node)
        if kept is not node:
            node.replace_all_uses_with(kept)
            merged[node] = kept
            gm.graph.erase_node(node)
    return bool(merged)
