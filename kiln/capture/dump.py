"""The capture layer's debug output: the `graph` and `guards` logs, and per compiled entry a
folder under KILN_DEBUG_DIR with the torch-level graph, the guards and the runner."""

from __future__ import annotations

from torch import fx

from typing import Any

from kiln import logs, trace


def _readable(label: str, gm: fx.GraphModule) -> str:
    return f"# {label}: torch-level graph, written by kiln.capture\n" + gm.print_readable(print_output=False)


def captured(label: str, gm: fx.GraphModule | None) -> logs.DumpFolder | None:
    """Log and dump the graph capture built, before the backend compiles it (folders in pipeline order)."""
    if gm is not None:
        logs.log_lazy("graph", lambda: f"captured graph of {label}:\n{_readable(label, gm)}")
    folder = logs.dump_folder(f"capture_{label}")
    if folder is not None and gm is not None:
        folder.write("captured_graph.py", _readable(label, gm))
    return folder


def guards(folder: logs.DumpFolder | None, label: str, guards_text: str, guards_code: str) -> None:
    """Log and dump the entry's guards (after the backend: shape guards may come from its tracing)."""
    logs.log_lazy("guards", lambda: f"guards of {label}:\n{guards_text}\n{guards_code}")
    if folder is not None:
        folder.write("guards.txt", f"{guards_text}\n\n# compiled to one check:\n{guards_code}")


def runner(folder: logs.DumpFolder | None, runner_source: str) -> None:
    if folder is not None:
        folder.write("runner.py", f"# a call that passes the guards: run the graph, replay side effects, rebuild the result\n{runner_source}")


def traced(event: str, label: str, entries: int, payload: Any) -> None:
    """One event of a frame's cache for the compile report (KILN_TRACE): an entry compiled (its
    graph, guards and the break that ended it), a recompile and the guard that failed, the frame
    run eagerly, the recompile limit reached."""
    if event == "entry":
        graph = payload.graph
        trace.record("entry", frame=label, entry=entries, seconds=payload.capture_seconds, stats=dict(payload.stats),
                     guards=[g.describe() for g in payload.guards.guards],
                     graph=_readable(label, graph) if graph is not None else None,
                     ended_by=str(payload.graph_break) if payload.graph_break is not None else None,
                     runner=payload.runner_source)
        trace.compile_finished()
    elif event == "recompile":
        trace.record("recompile", frame=label, entry=entries + 1, reason=f"{payload} failed")
    elif event == "fallback":
        trace.record("eager_frame", frame=label, record=str(payload))
    elif event == "limit":
        trace.record("recompile", frame=label, entry=entries, reason=f"recompile limit ({payload}) reached: calls that match no entry run eagerly")
