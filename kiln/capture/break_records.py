"""Why capture stopped: structured records, and the exceptions that carry them.

`Unsupported` is raised by the interpreter where it meets a construct it cannot model; the frame
then runs eagerly and a `BreakRecord` (kind, the user's file and line, explanation, hint) is kept
in `BREAKS` and logged under `KILN_LOGS=breaks`. With `fullgraph=True` the record is raised to
the user as `CaptureError` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln import logs, trace


@dataclass(frozen=True)
class BreakRecord:
    """One place where capture gave up, in the user's terms."""

    kind: str  # e.g. "unsupported_opcode", "data_dependent_branch", "unsupported_call"
    filename: str
    lineno: int
    explanation: str
    hint: str
    function: str = ""
    resumed: bool = False  # a graph break: the graph ended here and a resume function goes on

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno}" + (f" in {self.function}" if self.function else "")
        hint = f"\n  hint: {self.hint}" if self.hint else ""
        what = "graph break" if self.resumed else "frame runs eagerly"
        return f"[{self.kind}] {where}: {self.explanation} ({what}){hint}"


class Unsupported(Exception):
    """Raised inside the interpreter; the frame translator adds where it happened."""

    def __init__(self, kind: str, explanation: str, hint: str = "") -> None:
        super().__init__(explanation)
        self.kind, self.explanation, self.hint = kind, explanation, hint
        self.where: tuple[str, int, str] | None = None  # innermost user (file, line, function)
        self.at: tuple[int, int] | None = None  # (instruction index, arrival) in the compiled frame
        self.inlined = False  # raised inside a call the compiled frame was inlining

    def record(self, resumed: bool = False) -> "BreakRecord":
        filename, lineno, function = self.where or ("<unknown>", 0, "")
        return BreakRecord(self.kind, filename, lineno, self.explanation, self.hint, function, resumed)


class CaptureError(RuntimeError):
    """`fullgraph=True` and the frame could not be captured as one graph."""

    def __init__(self, record: BreakRecord) -> None:
        super().__init__(f"kiln.compile(fullgraph=True) could not capture one graph:\n{record}")
        self.record = record


BREAKS: list[BreakRecord] = []


def record_break(record: BreakRecord) -> None:
    BREAKS.append(record)
    logs.log("breaks", "%s", record)
    if trace.active():
        trace.record("break", kind=record.kind, filename=record.filename, lineno=record.lineno,
                     function=record.function, explanation=record.explanation, hint=record.hint,
                     resumed=record.resumed, source=_source_line(record.filename, record.lineno))


def _source_line(filename: str, lineno: int) -> str:
    """The user's line of code at the break, as the report shows it."""
    import linecache

    return linecache.getline(filename, lineno).strip()


def unsupported(kind: str, explanation: str, hint: str = "") -> Unsupported:
    """Build the exception to raise: `raise unsupported("unsupported_call", "...")`."""
    return Unsupported(kind, explanation, hint)
