"""What the AOT graph cache keeps of a compiled graph, and the graph loaded back from it.

`save(compiled)` gives a picklable payload (a `GraphArtifact`, or a `FrozenArtifact` around one),
or None for what cannot be kept (a graph calling a non-ATen extern, a graph specialized per size
at call time, a graph that fell back to eager); `load(payload)` returns the callable again.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

from kiln.runtime.compiled_graph import CompiledGraph, GraphArtifact
from kiln.runtime.frozen import FrozenArtifact, FrozenProgram


def save(compiled: Any) -> GraphArtifact | FrozenArtifact | None:
    if isinstance(compiled, FrozenProgram):
        return compiled.artifact(save)
    if not isinstance(compiled, CompiledGraph) or compiled.first_run is False:  # (False: it fell back)
        return None
    try:
        artifact = compiled.saved_artifact()
        pickle.dumps(artifact)
    except Exception:  # noqa: BLE001 - e.g. a non-ATen extern: not cached, still correct
        return None
    return artifact


def on_first_run(compiled: Any, then: Callable[[bool], None]) -> None:
    """`then(ok)` once the compiled graph inside `compiled` has run its first call (kiln/aot/compile.py
    `SavingGraphCompiler.on_first_run`); at once for what holds no such graph."""
    graph = compiled.runtime if isinstance(compiled, FrozenProgram) else compiled
    if isinstance(graph, CompiledGraph):
        graph.on_first_run(then)
    else:
        then(True)


def load(payload: GraphArtifact | FrozenArtifact) -> Any:
    if isinstance(payload, FrozenArtifact):
        return FrozenProgram.load(payload, load)
    return CompiledGraph.load(payload)
