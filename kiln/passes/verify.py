"""Invariants of an ATen graph between passes, checked by the driver after every rewrite under
`KILN_VERIFY=1`: the graph is well formed for fx (`Graph.lint`: nodes in topological order, users
and inputs consistent, targets that exist), and every op node carries the fake value
(`meta["val"]`) that the later passes and the lowering read its sizes, strides and dtype from
(placeholders need not: a plain-number input traced by make_fx has none, and is lowered as one)."""

from __future__ import annotations

import operator

from torch import fx


class GraphError(ValueError):
    """An ATen graph breaks an invariant after a pass; the message names the pass and the node."""


def verify_graph(gm: fx.GraphModule, after: str) -> None:
    try:
        gm.graph.lint()
    except Exception as error:  # noqa: BLE001 - any lint failure is the pass's fault
        raise GraphError(f"after pass {after}: {error}") from error
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem and "val" not in node.meta:
            raise GraphError(f"after pass {after}: node {node.name} ({node.target}) has no meta['val']")
