"""Graphs kiln could not compile and ran eagerly instead, each with its reason.

Never breaking the user's program means a failed compilation falls back to eager; never hiding it
means the fallback is recorded here, logged under `breaks`, told as a RuntimeWarning (logs on or
off: the graph has lost kiln's speed-up), and counted as a failure by the tests and by `kiln bench`
(the llm suite notes it beside the mode's figures).
"""

from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass

from kiln import logs, trace


@dataclass(frozen=True)
class GraphFallback:
    backend: str
    graph: str
    reason: str  # the exception's type and first line
    detail: str  # the traceback's last lines

    def __str__(self) -> str:
        return f"{self.backend}: graph {self.graph} runs eagerly: {self.reason}"


FALLBACKS: list[GraphFallback] = []


def record_fallback(backend: str, graph: str, error: BaseException, tell: bool = True) -> GraphFallback:
    """Remember that `graph` runs eagerly because compiling it raised `error`, and say so (a
    RuntimeWarning, logs on or off: the graph has lost kiln's speed-up) unless `tell` is False,
    where the caller warns in its own words."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    tail = "".join(traceback.format_exception(error)[-3:])
    fallback = GraphFallback(backend, graph, f"{type(error).__name__}: {first_line}", tail)
    FALLBACKS.append(fallback)
    logs.log("breaks", "%s", fallback)
    trace.record("fallback", backend=backend, graph=graph, reason=fallback.reason, detail=tail)
    if tell:
        warnings.warn(f"{fallback}, without kiln's speed-up (KILN_LOGS=breaks for the error's detail)", RuntimeWarning,
                      stacklevel=3)
    return fallback


def reset() -> None:
    FALLBACKS.clear()
