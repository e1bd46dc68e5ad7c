"""The compile trace: everything the HTML compile report shows, recorded as it happens.

`KILN_TRACE=dir` (the setting `debug.trace_dir`, or `kiln.compile(..., options={"trace": dir})`)
turns it on. Each stage then reports what it did with `record(kind, **fields)` — a frame captured,
a graph break, a recompile and its reason, a graph that fell back to eager, an autotuning
question with every candidate's time, a compile-time tree, the kernels of a compiled graph — and
the debug dumps of `KILN_DEBUG_DIR` (each pass's graph, the IR, the code) go to the same run
folder. `kiln/trace/html.py` turns the journal and those dumps into one self-contained
`<dir>/<run>/index.html`, written again whenever an outermost compile stage finishes and at exit,
so the page is current even when the process dies later.

This module sits below every stage (it imports only the settings): stages call it, it calls none
of them. With tracing off `record` costs one settings read.

Example::

    KILN_TRACE=/tmp/trace python my_model.py      # then open /tmp/trace/run_*/index.html
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln import config


@dataclass
class Event:
    kind: str  # "entry", "recompile", "break", "fallback", "autotune", "compile_time", "kernels", "dump", ...
    fields: dict[str, Any]
    at: float = field(default_factory=time.time)


EVENTS: list[Event] = []
_lock = threading.Lock()
_failed = False  # a report failed to be written (told once)


def active() -> bool:
    """Whether a trace is being recorded (the one check stages make before building fields)."""
    return config.debug.trace_dir is not None


def record(kind: str, /, **fields: Any) -> None:
    """Add one event to the journal (nothing when tracing is off). Fields are plain data (text,
    numbers, lists, dicts), built by the caller: the journal keeps no reference into compiled state."""
    if active():
        with _lock:
            EVENTS.append(Event(kind, fields))


_run: tuple[tuple[str, int], Path, itertools.count] | None = None  # ((dir, pid), run folder, dump counter)


def process_folder(base: str) -> tuple[Path, itertools.count]:
    """This process's run folder under `base` (made on first use) and the counter that numbers
    the graph dumps in it: the dumps (kiln/logs.py `dump_folder`) and the report share it."""
    global _run
    key = (base, os.getpid())  # a forked child gets a run folder of its own
    with _lock:
        if _run is None or _run[0] != key:
            stem = f"run_{os.getpid()}_{time.strftime('%Y%m%d-%H%M%S')}"
            parent = Path(os.path.expanduser(base))
            parent.mkdir(parents=True, exist_ok=True)
            # Several machines may share one folder, and pids repeat across machines.
            for attempt in itertools.count():
                run = parent / (stem if attempt == 0 else f"{stem}_{attempt}")
                try:
                    run.mkdir()
                    break
                except FileExistsError:
                    continue
            _run = (key, run, itertools.count())
        return _run[1], _run[2]


def run_folder() -> Path | None:
    """This process's folder under the trace directory, shared with the dumps (None when off)."""
    return process_folder(config.debug.trace_dir)[0] if active() else None


def write_report() -> Path | None:
    """Render the journal into `<run>/index.html` now; returns its path (None when off)."""
    folder = run_folder()
    if folder is None:
        return None
    from kiln.trace.html import render

    with _lock:
        events = list(EVENTS)
    page = render(events, folder)
    path = folder / "index.html"
    temp = folder / f".index.html.{os.getpid()}.tmp"
    temp.write_text(page, encoding="utf-8")
    os.replace(temp, path)  # a browser reloading the page never sees half of it
    return path


def compile_finished() -> None:
    """Called when an outermost compile stage closes: the report catches up. A report that
    cannot be written is told once and never fails the compilation it describes."""
    global _failed
    if not active():
        return
    try:
        write_report()
    except Exception as error:  # noqa: BLE001 - the user's model must not pay for the report
        if not _failed:
            _failed = True
            warnings.warn(f"kiln: the compile report (KILN_TRACE) could not be written: {type(error).__name__}: {error}",
                          RuntimeWarning, stacklevel=2)


def reset() -> None:
    """Forget the journal (kiln.reset, tests)."""
    with _lock:
        EVENTS.clear()


@atexit.register
def _at_exit() -> None:
    if active() and EVENTS:
        try:
            write_report()
        except Exception:  # noqa: BLE001 - a report must never turn a clean exit into a failure
            pass
