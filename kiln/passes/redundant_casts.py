"""Casts that change nothing, removed: to the dtype a value already has, or a round trip through a
wider type (bfloat16 -> float32 -> bfloat16) that gives the value back exactly. Autocast graphs are
full of both: each op casts its inputs to the dtype it computes in, whatever they already were.
A float32 -> bfloat16 -> float32 trip rounds, so it stays.
"""

from __future__ import annotations

import torch
from torch import fx

from kiln.ir.target import Target
from kiln.passes.pattern import Op, Var, matches, remove_dead

aten = torch.ops.aten

_CAST = Op(aten._to_copy.default, Var("x"), ..., name="cast")
_FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _only_dtype_changes(node: fx.Node) -> bool:
    return set(node.kwargs) <= {"dtype"} and len(node.args) == 1


def _exact_in(narrow: torch.dtype, wide: torch.dtype) -> bool:
    """Every `narrow` value is a `wide` value (so wide -> narrow after narrow -> wide is exact)."""
    if narrow == wide:
        return True
    if narrow in _FLOATS and wide in _FLOATS:
        return wide == torch.float64 or (wide == torch.float32 and narrow in (torch.float16, torch.bfloat16))
    return False


def _dtype(node: object) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def redundant_casts(gm: fx.GraphModule, target: Target) -> bool:
    changed = False
    returned = {n for n in next(n for n in gm.graph.nodes if n.op == "output").all_input_nodes}
    for node, found in matches(gm, _CAST):
        if not _only_dtype_changes(node) or node in returned:
            continue  # a returned cast is a fresh tensor the caller owns
        source, target = found["x"], _dtype(node)
        replacement = None
        if _dtype(source) == target:
            replacement = source
        elif isinstance(source, fx.Node) and source.op == "call_function" and source.target is aten._to_copy.default \
                and _only_dtype_changes(source) and _dtype(source.args[0]) == target and _exact_in(target, _dtype(source)):
            replacement = source.args[0]
        if replacement is not None and _same_layout(replacement, node):
            node.replace_all_uses_with(replacement)
            remove_dead(gm, [node])
            changed = True
    return changed


def _same_layout(a: fx.Node, b: fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.shape == vb.shape \
        and va.stride() == vb.stride() and va.device == vb.device
