"""Named log artifacts and per-graph debug dumps, on top of the standard ``logging`` module.

An artifact is one kind of report (captured graphs, guards, fusion decisions, ...), switched on
by name through ``kiln.config.debug.logs``, i.e. ``KILN_LOGS=graph,guards`` or ``all``::

    kiln.logs.set_logs("graph,code")
    kiln.logs.log("graph", "captured %d nodes", 12)           # [kiln:graph] captured 12 nodes
    kiln.logs.log_lazy("code", lambda: render(kernel))        # render() runs only when on

Each artifact logs at INFO to ``logging.getLogger("kiln.<name>")``. One handler on the
``kiln`` logger prints to stderr; records still propagate to the root logger, so pytest's
``caplog`` and an application's own handlers see them (an application that configures root
logging can set ``logging.getLogger("kiln").propagate = False`` to avoid seeing lines twice).

Unknown names in ``KILN_LOGS`` are reported at first use rather than at import, because later
layers add their artifacts with :func:`register_artifact` when they are imported.

With ``KILN_DEBUG_DIR`` set, :func:`dump_folder` gives each graph its own numbered folder.

This module must not import torch.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from kiln import config, trace

__all__ = [
    "DumpFolder",
    "artifacts",
    "dump_folder",
    "enabled",
    "enabled_artifacts",
    "log",
    "log_lazy",
    "register_artifact",
    "set_logs",
]

ALL = "all"

# --- the registry ----------------------------------------------------------------------------

_ARTIFACTS: dict[str, str] = {}  # name -> one-line help
_LOGGERS: dict[str, logging.Logger] = {}
_version = 0  # bumped on registration, so the cached set of enabled names is recomputed
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_artifact(name: str, help: str) -> None:
    """Add a log artifact that ``KILN_LOGS`` and :func:`set_logs` can switch on.

    Registering the same name with the same help again does nothing, so a module may be
    re-imported; a different help for a taken name is a ValueError.

    Example::

        kiln.logs.register_artifact("autotune", "candidate kernels and their timings")
    """
    global _version
    if not _NAME.fullmatch(name) or name == ALL:
        raise ValueError(f"artifact name must match {_NAME.pattern} and not be {ALL!r}: {name!r}")
    if not isinstance(help, str) or not help:
        raise ValueError(f"artifact {name!r} needs a one-line help text")
    if name in _ARTIFACTS:
        if _ARTIFACTS[name] != help:
            raise ValueError(f"log artifact {name!r} is already registered: {_ARTIFACTS[name]!r}")
        return
    logger = logging.getLogger(f"kiln.{name}")
    # Whether a message shows is decided by enabled(); the logger itself must let INFO through
    # even when the application left the root logger at its default WARNING.
    logger.setLevel(logging.INFO)
    _ARTIFACTS[name] = help
    _LOGGERS[name] = logger
    _version += 1


for _name, _help in {
    "graph": "captured torch-level graphs",
    "guards": "guards that keep a captured graph valid",
    "breaks": "graph breaks: where capture stopped and why",
    "recompiles": "recompilations and the guard that failed",
    "aot": "ATen forward/backward graphs and partition decisions",
    "passes": "the graph after each pass",
    "freezing": "frozen inputs, constants folded, memory of packed weights, re-freezes",
    "autotune": "autotune measurements and choices",
    "ir": "loop IR before and after fusion",
    "fusion": "fusion decisions and kernel counts",
    "code": "generated source code",
    "cache": "compile cache hits and misses",
    "compile_time": "seconds spent in each compile stage of each graph (capture, AOT, each pass, ..., build, load)",
    "bench": "benchmark harness progress",
    "runtime": "process-wide settings compiled graphs apply when they run (malloc's thresholds)",
    "cuda_graphs": "CUDA graphs recorded for compiled graphs (mode='reduce-overhead'), per set of input sizes",
    "triton": "Triton kernels of GPU graphs compiled ahead of their first launch, in parallel",
}.items():
    register_artifact(_name, _help)


def artifacts() -> dict[str, str]:
    """Every registered artifact name with its help.

    Example::

        for name, help in kiln.logs.artifacts().items(): print(name, help)
    """
    return dict(_ARTIFACTS)


# --- switching artifacts on ------------------------------------------------------------------


def _resolve(names: Iterable[str], where: str) -> frozenset[str]:
    unknown = [name for name in names if name != ALL and name not in _ARTIFACTS]
    if unknown:
        valid = [ALL, *sorted(_ARTIFACTS)]
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown log artifact {', '.join(map(repr, unknown))} in {where}{hint}; "
            f"valid names: {', '.join(valid)}"
        )
    return frozenset(_ARTIFACTS) if ALL in names else frozenset(names)


_active: tuple[object, int, frozenset[str]] | None = None  # (config value, _version, names)


def enabled_artifacts() -> frozenset[str]:
    """The artifact names that are on now; raises ValueError if the setting names unknown ones.

    Example::

        with kiln.config.patch({"debug.logs": "all"}):
            assert "fusion" in kiln.logs.enabled_artifacts()
    """
    global _active
    names = config.debug.logs
    cached = _active
    # Hot path: one identity check, since every log call asks.
    if cached is not None and cached[0] is names and cached[1] == _version:
        return cached[2]
    active = _resolve(names, "KILN_LOGS / kiln.config.debug.logs")
    _active = (names, _version, active)
    return active


def enabled(name: str) -> bool:
    """Whether artifact ``name`` is on; an unregistered name is a ValueError.

    Example::

        if kiln.logs.enabled("ir"):
            print(ir.pretty())
    """
    if name not in _ARTIFACTS:
        _resolve([name], "kiln.logs.enabled()")
    return name in enabled_artifacts()


def set_logs(names: str | Iterable[str]) -> None:
    """Switch on exactly these artifacts (a comma-separated string or a list; ``"all"``).

    Updates ``kiln.config.debug.logs``; unknown names are a ValueError and change nothing.

    Example::

        kiln.logs.set_logs("graph,code")
        kiln.logs.set_logs([])          # all off
    """
    if isinstance(names, str):
        parts = tuple(part.strip() for part in names.split(",") if part.strip())
    else:
        parts = tuple(names)
        if not all(isinstance(part, str) for part in parts):
            raise TypeError(f"set_logs expects artifact names as str, got {parts!r}")
    _resolve(parts, "kiln.logs.set_logs()")
    config.debug.logs = parts


def log(name: str, msg: str, *args: object) -> None:
    """Log ``msg % args`` at INFO under artifact ``name``, if it is on.

    Example::

        kiln.logs.log("cache", "hit %s", key)
    """
    if enabled(name):
        _LOGGERS[name].info(msg, *args, stacklevel=2)


def log_lazy(name: str, fn: Callable[[], str]) -> None:
    """Log the text ``fn()`` returns under artifact ``name``; ``fn`` is called only if it is on.

    Example::

        kiln.logs.log_lazy("graph", lambda: gm.print_readable(print_output=False))
    """
    if enabled(name):
        _LOGGERS[name].info("%s", fn(), stacklevel=2)


# --- output ----------------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time, so redirecting it (capsys) works."""

    is_kiln_handler = True  # how install finds a handler left by an earlier import

    def __init__(self) -> None:
        logging.Handler.__init__(self)  # StreamHandler's would bind one stream for good

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr


class _ArtifactFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        artifact = record.name.removeprefix("kiln.")
        return f"[kiln:{artifact}] {super().format(record)}"


def _install_handler() -> None:
    root = logging.getLogger("kiln")
    if any(getattr(handler, "is_kiln_handler", False) for handler in root.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(_ArtifactFormatter("%(message)s"))
    root.addHandler(handler)


_install_handler()


# --- debug dumps -----------------------------------------------------------------------------


def _safe_name(text: str) -> str:
    # Labels come from user code (function names, module paths); keep them to one path part.
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")
    return name[:100] or "unnamed"


def _atomic_write(path: Path, text: str) -> None:
    # A reader (or a crash) never sees half a file: write aside, then rename over.
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


class DumpFolder:
    """One graph's dump folder; files are numbered in the order they are written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._count = itertools.count()

    def write(self, stage: str, text: str) -> Path:
        """Write ``text`` to ``<NN>_<stage>`` in this folder and return the file's path.

        Example::

            folder.write("captured_graph.py", gm.code)   # .../00_captured_graph.py
        """
        if not isinstance(text, str):
            raise TypeError(f"DumpFolder.write expects text as str, got {type(text).__name__}")
        path = self.path / f"{next(self._count):02d}_{_safe_name(stage)}"
        _atomic_write(path, text)
        return path

    def __repr__(self) -> str:
        return f"DumpFolder({str(self.path)!r})"


def dump_folder(label: str) -> DumpFolder | None:
    """A new folder ``<dump_dir>/<run>/<NNN>_<label>/`` for one graph, or None without dump_dir.

    ``<run>`` is one folder per process and ``NNN`` counts graphs within it, so nothing is
    overwritten and folders list in the order graphs were compiled.

    Example::

        folder = kiln.logs.dump_folder("forward")
        if folder is not None:
            folder.write("captured_graph.py", gm.code)
    """
    # Under KILN_TRACE the dumps are the report's pages: they go to the trace's run folder
    # unless KILN_DEBUG_DIR names another.
    dump_dir = config.debug.dump_dir or config.debug.trace_dir
    if dump_dir is None:
        return None
    run, counter = trace.process_folder(dump_dir)
    path = run / f"{next(counter):03d}_{_safe_name(label)}"
    path.mkdir()
    trace.record("dump", label=label, path=str(path))
    return DumpFolder(path)
