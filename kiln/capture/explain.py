"""`kiln.explain(fn, *args, **kwargs)`: what kiln's capture makes of one call, in the user's terms.

The call runs once through kiln's capture with a backend that keeps each graph as it is; every
frame kiln compiles on the way — the function, its resume functions after graph breaks, callees
compiled as frames of their own — reports its graphs, ops, guards, breaks and recompiles here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import fx

from kiln import config
from kiln.capture.api import capture
from kiln.capture.break_records import BreakRecord
from kiln.capture.cache import OBSERVERS
from kiln import heap


@dataclass
class GraphReport:
    """One graph kiln captured: the frame it came from, its ops and the guards that keep it valid."""

    frame: str
    ops: list[str]
    guards: list[str]
    ended_by: BreakRecord | None = None  # the graph break that ended it, if one did


@dataclass
class ExplainReport:
    """Returned (and printed) by `kiln.explain`."""

    function: str
    graphs: list[GraphReport] = field(default_factory=list)
    breaks: list[BreakRecord] = field(default_factory=list)  # graph breaks and frames run eagerly
    recompiles: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the user should know beyond the graphs
    # What kiln does to glibc's malloc in this process (runtime.keep_freed_mb, kiln/heap.py):
    # a process-wide change the user asked for, or none.
    malloc: str = ""

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return sum(r.resumed for r in self.breaks)

    def __str__(self) -> str:
        eager = sum(not r.resumed for r in self.breaks)
        lines = [f"kiln.explain({self.function}): {self.graph_count} graph(s), {self.break_count} graph break(s), "
                 f"{len(self.recompiles)} recompile(s), {eager} frame(s) run eagerly"]
        for n, graph in enumerate(self.graphs, 1):
            shown = ", ".join(graph.ops[:12]) + (", ..." if len(graph.ops) > 12 else "")
            lines.append(f"\nGraph {n}: {graph.frame}, {len(graph.ops)} op(s): {shown}")
            if graph.ended_by is not None:
                lines.append(f"  ended by a graph break: {graph.ended_by}".replace("\n", "\n  "))
            lines.append(f"  guards ({len(graph.guards)}):")
            lines += [f"    {g}" for g in graph.guards]
        if self.breaks:
            lines.append("\nGraph breaks and eager frames:")
            lines += [f"  {n}. {record}".replace("\n", "\n     ") for n, record in enumerate(self.breaks, 1)]
        if self.recompiles:
            lines.append("\nRecompiles:")
            lines += [f"  {reason}" for reason in self.recompiles]
        if self.notes:
            lines.append("\nNotes:")
            lines += [f"  - {note}" for note in self.notes]
        if self.malloc:
            lines.append(f"\nmalloc: {self.malloc}")
        return "\n".join(lines)


def _op_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return f".{node.target}"
    return getattr(node.target, "__name__", str(node.target))


def _observer(report: ExplainReport) -> Callable[[str, Any, Any], None]:
    def observe(event: str, cache: Any, payload: Any) -> None:
        if event == "entry":
            if payload.graph_break is not None:
                report.breaks.append(payload.graph_break)
            if payload.graph is None:
                return
            ops = [_op_name(n) for n in payload.graph.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
            report.graphs.append(GraphReport(cache.label, ops, [g.describe() for g in payload.guards.guards], payload.graph_break))
        elif event == "recompile":
            report.recompiles.append(f"{cache.label}: {payload} failed")
        elif event == "fallback":
            report.breaks.append(payload)
        elif event == "limit":
            report.recompiles.append(f"{cache.label}: recompile limit ({payload}) reached; later calls run eagerly")

    return observe


def explain(fn: Any, *args: Any, **kwargs: Any) -> ExplainReport:
    """Capture `fn(*args, **kwargs)` with kiln, run it once, and return (and print) what happened:
    the graphs and the ops in each, every graph break with its kind, the user's file:line, an
    explanation and a hint, the guards of each graph, recompiles, and what kiln does to glibc's
    malloc in this process (`runtime.keep_freed_mb`: left alone unless asked for).

    Example::

        report = kiln.explain(model, input_ids)
        assert report.break_count == 0
    """
    if not callable(fn):
        raise TypeError(f"kiln.explain: fn must be a function, method or nn.Module, got {type(fn).__name__}")
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    report = ExplainReport(name)
    observer = _observer(report)
    compiled = capture(fn, _keep_graph)
    OBSERVERS.append(observer)
    try:
        compiled(*args, **kwargs)
    finally:
        OBSERVERS.remove(observer)
    if isinstance(fn, torch.nn.Module) and config.backend.freezing and next(_state(fn), None) is not None:
        report.notes.append(FROZEN_WRITES)
    report.malloc = heap.describe()
    print(report)
    return report


FROZEN_WRITES = (
    "In inference kiln freezes this module's parameters and buffers (backend.freezing). It sees every change "
    "made through PyTorch, `.data` of parameters included, but not: writes through `.data` of a buffer, "
    "through a `.data` tensor taken before the first compiled call, or outside PyTorch (tensor.numpy(), "
    "DLPack, data_ptr()). After such a write call kiln.refreeze(model) (docs/freezing.md).")


def _state(module: torch.nn.Module):
    yield from module.parameters()
    yield from module.buffers()


def _keep_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    return gm.forward
