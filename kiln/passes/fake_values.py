"""Recompute the fake values (`meta["val"]`) of a graph after a pass changed what a node returns.

A pass that makes a convolution return channels-last data changes the strides of everything
computed from it; the lowering writes an extern's computed arguments in the layout these values
say. The values the graph returns keep eager's layout, so the caller sees eager's strides.

A `view` whose input became channels-last may have no strided form any more (MobileViT folds a
convolution's output into patches with views): ATen's view refuses it, while kiln lowers a view as
an index map over the logical tensor, whatever the layout. Its fake value is then the reshape's,
a copy in the contiguous layout kiln writes such a value in when it stores it. Without that, the
one refusal left every value of the graph stale: MobileViT's concatenations of two channels-last
convolution outputs were written channels-first, gathered lane by lane (0.47 ms instead of 0.06).
"""

from __future__ import annotations

import torch
from torch import fx
from torch.utils import _pytree as pytree


def _fake_mode(gm: fx.GraphModule):
    for node in gm.graph.nodes:
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        if mode is not None:
            return mode
    return None


def _static(gm: fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        for v in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape)):
                return False
    return True


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _run(target, args: tuple, kwargs: dict):
    try:
        return target(*args, **kwargs)
    except (RuntimeError, ValueError):  # fake tensors raise ValueError where ATen raises RuntimeError
        if target not in _VIEWS:
            raise
        return torch.ops.aten.reshape.default(*args, **kwargs)


def refresh_meta(gm: fx.GraphModule) -> bool:
    """Re-run every call on fake values; True when done (graphs with symbolic sizes are left
    as they are: re-running would mint new symbols)."""
    mode = _fake_mode(gm)
    if mode is None or not _static(gm):
        return False
    output = next(n for n in gm.graph.nodes if n.op == "output")
    returned = {n for n in pytree.tree_leaves(output.args) if isinstance(n, fx.Node)}
    fresh: dict[fx.Node, object] = {}
    value = lambda n: fresh.get(n, n.meta.get("val"))  # noqa: E731
    try:
        with mode:
            for node in gm.graph.nodes:
                if node.op == "call_function" and node not in returned:
                    args, kwargs = pytree.tree_map_only(fx.Node, value, (node.args, node.kwargs))
                    fresh[node] = _run(node.target, args, kwargs)
    except Exception:  # noqa: BLE001 - an op without a fake kernel: keep eager's values, all of them
        return False
    for node, val in fresh.items():
        node.meta["val"] = val
    return True
