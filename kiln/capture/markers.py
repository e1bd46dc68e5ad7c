"""Calls the user's code makes that mean something to the capture and nothing to Python."""

from __future__ import annotations


def graph_break(msg: str = "") -> None:
    """Ends the graph kiln is capturing here: what comes before and after compile as separate
    graphs, this call runs in Python between them (and does nothing). The same as
    Dynamo's own `graph_break()`, which kiln honours too; under `fullgraph=True`, an error.

        def f(x):
            y = x.sin()
            kiln.graph_break()   # e.g. to see each half's code apart
            return y.cos()
    """
