"""kiln's compiled code as torch.profiler sees it: a labelled range per compiled graph call, an
event per kernel and extern call inside it, named as the generated code names them.

Nothing is added while no profiler runs: a call asks `active()` (one flag read in C, 0.06 µs) and
takes the plain path. Under `torch.profiler.profile()` (or any profiler of the autograd kind), a
`CompiledGraph` call opens `record_function(graph.region)` and runs its *instrumented* wrapper
(`CompiledGraph.instrumented`, the same wrapper text with every kernel, extern operator and
layout copy wrapped in its own `record_function`). A graph with a C++ wrapper runs that Python
twin while profiled: the same kernels and extern calls in the same order, so every one is seen
(the host time between them is the Python wrapper's, not the C++ wrapper's).

Region names say where a graph came from: `kiln graph_3 · inference · kiln.compile frame forward`
(kiln's capture) or `kiln graph_3 · forward · torch.compile` (Dynamo's, whose own
`Torch-Compiled Region: f/r` range holds it and names the frame and recompile). kiln's capture
adds `kiln frame <function> · entry <k>` around each call of its k-th compiled entry (k - 1 is
the number of recompiles before it). Compilation appears as `kiln compile: <stage>` ranges
(kiln/compile_time.py), and the AOT graph cache's answers as `kiln cache hit: aot graph` or
`kiln cache miss: aot graph`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

active: Callable[[], bool] = torch._C._autograd._profiler_enabled  # the profiler's own flag
# ATen's range without record_function's Python layers: 1 µs an event where record_function
# takes 12 (a tiny model's kernels take a few µs each), reusable, so made once per name.
_FAST = getattr(torch._C._profiler, "_RecordFunctionFast", None)


def region(name: str) -> contextlib.AbstractContextManager:
    """A labelled range on the profiler's timeline (a context manager that may be entered again)."""
    return _FAST(name) if _FAST is not None else _Range(name)


class _Range:
    """record_function, re-enterable, where ATen lacks the fast range."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.current = torch.profiler.record_function(self.name)
        self.current.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.current.__exit__(*exc)


def mark(name: str) -> None:
    """An event of its own at this point of the timeline (a cache hit, a miss), where a profiler runs."""
    if active():
        with region(name):
            pass


@contextlib.contextmanager
def maybe_region(name: str) -> Iterator[None]:
    """`region(name)` while a profiler runs, nothing otherwise (for code that runs once, such as
    compilation, not for a call's hot path)."""
    if not active():
        yield
        return
    with region(name):
        yield


def traced(name: str, fn: Callable) -> Callable:
    """`fn` with each call inside a range named `name`."""
    span = region(name)

    def call(*args: Any, **kwargs: Any) -> Any:  # (an extern may take keyword arguments: sdpa's scale)
        with span:
            return fn(*args, **kwargs)

    return call


def graph_label(open_stages: list[str]) -> str:
    """The name of a compiled graph's range, from the compile-time stages open while it is built
    or loaded (kiln/compile_time.py `open_stages`): its graph number and role, and the door."""
    graph = next((s for s in open_stages if s.startswith("graph_")), "graph")
    roles = {"inference graph": "inference", "forward graph": "forward", "backward graph": "backward"}
    role = next((roles[s] for s in open_stages if s in roles), None)
    frame = next((s for s in open_stages if s.startswith("frame ")), None)
    door = f"kiln.compile {frame}" if frame is not None else "torch.compile"
    return " · ".join(part for part in (f"kiln {graph}", role, door) if part)
