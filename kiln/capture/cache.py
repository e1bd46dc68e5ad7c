"""Per-function cache of compiled entries, the recompile limit, and the eager fallback.

A call binds its arguments, checks the entries' guards and runs the first that holds, the entry
that ran last checked first (a generation loop's decode step, after its prefill, then costs one
check, not two).
A miss captures again (logged under `recompiles` with the guard that failed), until
`kiln.config.capture.recompile_limit` entries exist; beyond that, misses run eagerly (a warning
says so once per function, and `eager_calls` counts them).
"""

from __future__ import annotations

import contextlib
import types
import warnings
import weakref
from typing import Any, Callable, Iterator

import torch

from kiln import config, logs, profiler, settled, trace
from kiln.capture import dump
from kiln.capture.break_records import BreakRecord, CaptureError, Unsupported, record_break
from kiln.capture.dynamic import DynamicPolicy
from kiln.capture.frame import Entry, capture
from kiln.capture.settled_entry import SettledEntry
from kiln.capture.sources import Namespace
from kiln.capture.user_exceptions import UserRaise

_ALL_CACHES: "weakref.WeakSet[FrameCache]" = weakref.WeakSet()

# Called as observer(event, cache, payload) for "entry" (an Entry), "recompile" (the failed
# guard, described), "fallback" (a BreakRecord) and "limit" (the limit): kiln.explain listens.
OBSERVERS: list[Callable[[str, "FrameCache", Any], None]] = []


def _notify(event: str, cache: "FrameCache", payload: Any) -> None:
    for observer in OBSERVERS:
        observer(event, cache, payload)
    if trace.active():
        dump.traced(event, cache.label, len(cache.entries), payload)


class FrameCache:
    def __init__(self, fn: Any, binder: Callable[..., tuple], eager: Callable, backend: Callable, fullgraph: bool, label: str,
                 recompile_limit: int | None, dynamic: bool | None = None) -> None:
        self.fn, self.binder, self.eager, self.backend = fn, binder, eager, backend
        self.fullgraph, self.label = fullgraph, label
        self.recompile_limit = recompile_limit
        self.dynamic = DynamicPolicy(dynamic)
        self.entries: list[Entry] = []  # in the order they were compiled
        self._by_last_use: list[Entry] = []  # the order their guards are checked in
        self.fallback: BreakRecord | None = None  # set when the frame runs eagerly for good
        self.limit_hit = False
        self.eager_calls = 0
        _ALL_CACHES.add(self)

    def clear(self) -> None:
        self.entries.clear()
        self._by_last_use.clear()
        self.fallback = None
        self.limit_hit = False
        self.dynamic.seen.clear()
        self.dynamic.seen_ints.clear()

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        L = self.binder(*args, **kwargs)
        # A step of a settled run (kiln/settled.py): the entry of the run's last call may hold by
        # the guards that read what changed (kiln/capture/settled_entry.py).
        run = settled.take()
        if run is not None:
            last = run.kept.get(self)
            if last is not None and last.holds(L):
                return self._run(last.entry, L, run)
        by_last_use = self._by_last_use
        for index, entry in enumerate(by_last_use):
            if entry.guards.check(L):
                if index:
                    by_last_use.insert(0, by_last_use.pop(index))
                if run is not None:
                    SettledEntry.after_check(run, self, entry, L)
                return self._run(entry, L, run if run is not None and entry.stamps_once else None)
        if run is not None:
            run.kept.pop(self, None)
        return self._miss(L, args, kwargs)

    def _run(self, entry: Entry, L: tuple, run: settled.Run | None) -> Any:
        """`entry.run(L)`; a settled run's step under the run's mark (its frozen program stamps
        its weights once a run)."""
        if profiler.active():
            with profiler.region(f"kiln frame {self.label} · entry {self.entries.index(entry) + 1}"):
                return settled.call(run, entry.run, L) if run is not None else entry.run(L)
        return settled.call(run, entry.run, L) if run is not None else entry.run(L)

    def _miss(self, L: tuple, args: tuple, kwargs: dict) -> Any:
        if self.fallback is not None:
            self.eager_calls += 1
            return self.eager(*args, **kwargs)
        limit = self.recompile_limit if self.recompile_limit is not None else config.capture.recompile_limit
        if len(self.entries) >= limit:
            if not self.limit_hit:
                self.limit_hit = True
                logs.log("recompiles", "%s: recompile limit (%d) reached; calls that match no entry run eagerly", self.label, limit)
                # Told once per function even with logs off: from here on these calls lose kiln's
                # speed-up, and the user can only fix it (dynamic=True, a higher limit) knowing.
                failed = self.entries[-1].guards.first_failure(L) if self.entries else None
                warnings.warn(f"kiln.compile: {self.label} was compiled {limit} times, the recompile limit "
                              f"(last guard failed: {failed.describe() if failed is not None else 'a guard'}); "
                              f"calls that match none of its compiled entries now run eagerly. If its input "
                              f"sizes change from call to call, compile it with dynamic=True; or raise "
                              f"KILN_RECOMPILE_LIMIT (kiln.compile(..., options={{'recompile_limit': n}})).",
                              RuntimeWarning, stacklevel=4)
                _notify("limit", self, limit)
            self.eager_calls += 1
            return self.eager(*args, **kwargs)
        if self.entries:
            failed = self.entries[-1].guards.first_failure(L)
            reason = failed.describe() if failed is not None else "a guard"
            logs.log("recompiles", "%s: recompiling (entry %d): %s failed", self.label, len(self.entries) + 1, reason)
            _notify("recompile", self, reason)
            # Against every entry's guards, not the last one's only: calls of two kinds take turns
            # (a generate's prefill and its decode step), and a size that changed since the entry
            # of the same kind would otherwise go unnoticed — a static KV cache of another length
            # compiled the prefill and the step again for each length, up to the limit.
            guards = [g for entry in self.entries for g in entry.guards.guards]
            changed = self.dynamic.note_changes(guards, lambda source: read_source(source, L))
            if changed:
                logs.log("recompiles", "%s: sizes or ints changed (%s): captured again with them symbolic", self.label, "; ".join(changed))
        try:
            with _without_saved_tensor_hooks():
                entry = capture(self.fn, L, self.backend, self.label, allow_breaks=not self.fullgraph, dynamic=self.dynamic)
        except Unsupported as error:
            record = error.record()
            if self.fullgraph:
                raise CaptureError(record) from None
            return self._eager_after(record, args, kwargs)
        except UserRaise as raised:
            # The traced code raised and nothing caught it: eager raises it for real.
            self.eager_calls += 1
            result = self.eager(*args, **kwargs)
            # Eager returned: kiln's interpretation raised where the function does not (a bug of
            # kiln's). The result is eager's; the frame runs eagerly from now on, recorded and
            # told, never silently.
            self._fall_back(_internal_error(self.fn, RuntimeError(
                f"kiln's interpreter raised {_exception_text(raised.exc)} where the function returns")), stacklevel=5)
            return result
        except Exception as error:  # noqa: BLE001 - kiln's own capture failed, not the user's code
            if self.fullgraph:
                raise
            return self._eager_after(_internal_error(self.fn, error), args, kwargs)
        if entry.graph_break is not None:
            record_break(entry.graph_break)  # once: a break inside a callee is recorded by the callee's frame
        self.entries.append(entry)
        self._by_last_use.insert(0, entry)
        _notify("entry", self, entry)
        logs.log("recompiles" if len(self.entries) > 1 else "graph", "%s: compiled entry %d in %.2f s (%s)", self.label,
                 len(self.entries), entry.capture_seconds, ", ".join(f"{k} {v}" for k, v in entry.stats.items()))
        return entry.run(L)

    def _eager_after(self, record: BreakRecord, args: tuple, kwargs: dict) -> Any:
        """The frame runs eagerly from now on, recorded, told to the user once."""
        self._fall_back(record, stacklevel=6)
        self.eager_calls += 1
        return self.eager(*args, **kwargs)

    def _fall_back(self, record: BreakRecord, stacklevel: int) -> None:
        """`stacklevel`: the warning's, from `_fall_back` to the user's call."""
        record_break(record)
        self.fallback = record
        _notify("fallback", self, record)
        warn_eager_frame(self.fn, self.label, record, stacklevel + 1)


@contextlib.contextmanager
def _without_saved_tensor_hooks() -> Iterator[None]:
    """The user's saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) set aside while
    kiln captures and compiles: its tracing saves tensors too, and those are not the program's
    (the hooks ran 5 times for one product; the compiled call runs them as eager does)."""
    autograd = torch._C._autograd
    stack = []
    while (top := autograd._top_saved_tensors_default_hooks(True)) is not None:
        stack.append(top)
        autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(stack):
            autograd._push_saved_tensors_default_hooks(pack, unpack)


def _exception_text(exc: Any) -> str:
    if exc.value is not None:
        return f"{exc.exc_type.__name__}({str(exc.value)!r})"
    args = [a.as_constant() if a.is_constant() else a.describe() for a in exc.args]
    return f"{exc.exc_type.__name__}({', '.join(map(repr, args))})"


def _internal_error(fn: Any, error: Exception) -> BreakRecord:
    """A failure inside kiln's capture as the frame's record: the user's program goes on eagerly."""
    code = getattr(fn, "__code__", None)
    where = (code.co_filename, code.co_firstlineno, code.co_name) if code is not None else ("<unknown>", 0, "")
    return BreakRecord("internal_error", where[0], where[1], f"kiln's capture failed: {type(error).__name__}: {error}",
                       "a bug in kiln: please report it with this message (KILN_LOGS=breaks shows the frame)", where[2])


# The labels warned about, per code object: every compiled module's frame is one code object
# (api.py `_module_call`), told apart by its label (the module's class).
_WARNED: "weakref.WeakKeyDictionary[types.CodeType, set[str]]" = weakref.WeakKeyDictionary()


def warn_eager_frame(fn: Any, label: str, record: BreakRecord, stacklevel: int) -> None:
    """Tell the user, once per code object and label, that a whole frame runs eagerly: every call
    of it loses kiln's speed-up, which `kiln.explain` shows only to those who ask."""
    code = getattr(fn, "__code__", None)
    if not config.capture.warn_eager_frames or code is None or label in _WARNED.get(code, ()):
        return
    _WARNED.setdefault(code, set()).add(label)
    warnings.warn(f"kiln.compile: {label} runs eagerly, without kiln's speed-up: {record}\n"
                  f"kiln.explain(fn, *args) lists every break; KILN_WARN_EAGER_FRAMES=0 silences this warning.",
                  RuntimeWarning, stacklevel=stacklevel)


def read_source(source: Any, L: tuple) -> Any:
    """The value `source` names in the call whose bound arguments are `L`."""
    ns = Namespace()
    return eval(source.expr(ns), dict(ns.values), {"L": L})


def all_caches() -> list[FrameCache]:
    """Every live compiled function's cache (for reports and the benchmark)."""
    return list(_ALL_CACHES)


def reset_all() -> None:
    for cache in list(_ALL_CACHES):
        cache.clear()
    _WARNED.clear()  # (frames compiled again are told about again)
