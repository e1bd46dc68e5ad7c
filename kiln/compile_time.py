"""Compile-time attribution: where the seconds of compiling a graph went, stage by stage.

Every stage of kiln that compiles something opens a named stage around its work::

    with compile_time.stage("lowering"):
        program = GraphLowering(gm).lower()

Stages nest (capture -> AOT -> one group per graph -> each pass, lowering, scheduling, code
generation, build, load), and each records the time spent in it *outside* its nested stages, so
the tree adds up. When the outermost stage closes, its tree is logged under `KILN_LOGS=compile_time`
and kept as `last()`. Timing is always on: it costs two clock reads per stage.

Example::

    KILN_LOGS=compile_time python my_model.py
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from kiln import logs, profiler, trace

@dataclass
class Stage:
    name: str
    self_name: str | None = None  # how the time outside nested stages is shown, when it has them
    seconds: float = 0.0  # inclusive
    children: list["Stage"] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    entries: int = 0  # times the stage was entered (more than once only when merged)

    @property
    def self_seconds(self) -> float:
        return self.seconds - sum(c.seconds for c in self.children)

    def find(self, name: str) -> list["Stage"]:
        """Every stage named `name` in this tree, in order."""
        found = [self] if self.name == name else []
        for child in self.children:
            found += child.find(name)
        return found

    def format(self, indent: int = 0) -> list[str]:
        note = f"  ({'; '.join(self.notes)})" if self.notes else ""
        lines = [f"{'  ' * indent}{self.name:<{max(1, 40 - 2 * indent)}} {self.seconds:8.3f} s{note}"]
        if self.children and self.self_name is not None and self.self_seconds >= 0.0005:
            lines.append(f"{'  ' * (indent + 1)}{self.self_name:<{max(1, 38 - 2 * indent)}} {self.self_seconds:8.3f} s")
        for child in self.children:
            lines += child.format(indent + 1)
        return lines


_state = threading.local()
_last: Stage | None = None

# What each stage's own time counts as in a per-model breakdown (`by_part`): capture, the AOT layer,
# kiln's graph passes, autotuning, lowering, scheduling, code generation, the C++ (or Triton) build,
# loading. The stage of one graph (graph_N) and its backend entry count as the AOT layer's.
PARTS = ("capture", "aot", "passes", "autotune", "lowering", "scheduling", "codegen", "build", "load")


def part_of(name: str) -> str:
    """The part of compilation a stage named `name` spends its own time on (one of PARTS)."""
    if name.startswith("frame "):
        return "capture"
    if name.startswith("pass "):
        return "passes"
    if name.startswith("codegen "):
        return "codegen"
    return name if name in PARTS else "aot"


def _stack() -> list[Stage]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


@contextlib.contextmanager
def stage(name: str, self_name: str | None = None, merge: bool = False) -> Iterator[Stage]:
    """Time the enclosed work as stage `name` (nested in the stage open around it, if any).

    `self_name`: for a stage with nested stages, the name its own remaining time is shown under
    (e.g. the frame stage of kiln's capture shows it as "capture"). `merge`: add the time to the
    enclosing stage's child of the same name, if it has one (work done in many small pieces, such
    as autotuning each GEMM of a graph, shows as one line)."""
    global _last
    stack = _stack()
    siblings = stack[-1].children if stack else []
    current = next((c for c in siblings if c.name == name), None) if merge else None
    if current is None:
        current = Stage(name, self_name)
        siblings.append(current)
    current.entries += 1
    stack.append(current)
    start = time.perf_counter()
    try:
        with profiler.maybe_region(f"kiln compile: {name}"):
            yield current
    finally:
        current.seconds += time.perf_counter() - start
        stack.pop()
        if not stack:
            _last = current
            for trees in getattr(_state, "recorders", ()):
                trees.append(current)
            logs.log_lazy("compile_time", lambda: "\n".join(current.format()))
            if trace.active():
                trace.record("compile_time", tree="\n".join(current.format()), seconds=current.seconds)
                trace.compile_finished()


def open_stages() -> list[str]:
    """The names of the stages open in this thread, outermost first."""
    return [stage.name for stage in _stack()]


def note(text: str) -> None:
    """Attach `text` to the innermost open stage (e.g. how many kernels were built)."""
    stack = _stack()
    if stack:
        stack[-1].notes.append(text)


def last() -> Stage | None:
    """The tree of the last outermost stage that finished in this process."""
    return _last


@contextlib.contextmanager
def recording() -> Iterator[list[Stage]]:
    """Every outermost tree that finishes in this thread while the block runs, in order (a model's
    first call compiles one frame per graph break, each its own tree)."""
    trees: list[Stage] = []
    if not hasattr(_state, "recorders"):
        _state.recorders = []
    _state.recorders.append(trees)
    try:
        yield trees
    finally:
        _state.recorders.remove(trees)


def by_part(trees: list[Stage]) -> dict[str, float]:
    """Seconds per part of compilation (PARTS, every one present) over `trees`: each stage's own
    time, outside its nested stages, added to its part."""
    seconds = dict.fromkeys(PARTS, 0.0)
    pending = list(trees)
    while pending:
        stage = pending.pop()
        seconds[part_of(stage.name)] += max(stage.self_seconds, 0.0)
        pending.extend(stage.children)
    return seconds
