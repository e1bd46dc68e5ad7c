"""Pick the fastest of a few candidates, measured once per question and remembered on disk."""

from __future__ import annotations

from typing import Any, Callable

from kiln import compile_time, logs, trace
from kiln.autotune import record, store
from kiln.autotune.timing import Timer, host_seconds, interleaved_seconds

# Within this fraction of the fastest, the earlier candidate (the simpler one) is kept: closer
# timings are noise on a shared machine, and a needless library switch is a risk for nothing.
_TIE = 0.03

# Results measured in this process, so a question asked by many graphs is answered once.
_MEMORY: dict[str, dict[str, Any]] = {}
# Questions answered by measuring and from the caches, for `kiln autotune`'s report.
COUNTS = {"measured": 0, "cached": 0, "recorded": 0}


def choose(op: str, signature: Any, candidates: dict[str, Callable[[], object]], budget_s: float = 0.25,
           max_rounds: int = 15, cleanup: Callable[[], None] | None = None, timer: Timer = host_seconds,
           question: Callable[[], dict[str, Any]] | None = None, default: str | None = None) -> str:
    """The name of the fastest candidate for `signature` (anything with a stable repr: shapes,
    dtypes, flags). Candidates run with inputs the caller prepared, interleaved in rounds until
    their timed runs add up to `budget_s` or `max_rounds` (kiln/autotune/timing.py); the first
    one wins ties.
    `cleanup` runs once the question is measured (to free what the candidates allocated).
    `timer` measures one run: the host's clock by default, `timing.gpu_seconds` for GPU kernels.
    `question` (a function returning what asks it again, kiln/autotune/record.py; called only then:
    reading a symbolic size as an int would specialize it) and `default` (the choice without
    tuning): under `backend.autotune=record` a question no cache answers is logged and `default`
    returned, nothing measured.

        choose("mm", ((128, 768), (768, 768)), {"aten": run_aten, "mkl": run_mkl})  # -> "mkl"
    """
    names = list(candidates)
    if len(names) == 1:
        return names[0]
    key = store.question_key(op, signature, names)
    result = _MEMORY.get(key) or store.load(key)
    answered = "from the cache"
    if result is None or result["choice"] not in candidates:
        if question is not None and default in candidates and record.recording():
            record.record(question())
            COUNTS["recorded"] += 1
            if trace.active():
                trace.record("autotune", op=op, signature=repr(signature), candidates=names, choice=default,
                             seconds={}, answered="recorded for `kiln autotune --answer`, default taken")
            return default  # (not remembered: a later answer is read)
        measured_before = COUNTS["measured"]
        with store.locked(key):
            result = _measured(op, signature, key, candidates, budget_s, max_rounds, cleanup, timer)
        answered = "measured" if COUNTS["measured"] > measured_before else answered
    else:
        COUNTS["cached"] += 1
    _MEMORY[key] = result
    if trace.active():
        trace.record("autotune", op=op, signature=repr(signature), candidates=names, choice=result["choice"],
                     seconds=dict(result.get("seconds", {})), answered=answered)
    return result["choice"]


def _measured(op: str, signature: Any, key: str, candidates: dict[str, Callable[[], object]], budget_s: float,
              max_rounds: int, cleanup: Callable[[], None] | None, timer: Timer) -> dict[str, Any]:
    """The answer to question `key`: another process's, when it measured while this one waited
    for the lock; else measured now and saved."""
    result = store.load(key)
    if result is not None and result["choice"] in candidates:
        COUNTS["cached"] += 1
        return result
    with compile_time.stage("autotune", merge=True) as timed:
        try:
            times, report = interleaved_seconds(candidates, budget_s, max_rounds=max_rounds, timer=timer)
        finally:
            if cleanup is not None:
                cleanup()
        timed.notes[:] = [f"{timed.entries} question{'s' if timed.entries > 1 else ''} measured"]
    choice = fastest(times)
    result = {"op": op, "signature": repr(signature), "choice": choice, "seconds": times, "rounds": report.rounds,
              "remeasured": report.remeasured, "extra_rounds": report.extra_rounds}
    if report.failed:
        result["failed"] = report.failed
        logs.log("autotune", "%s %s: candidates that raised: %s", op, signature,
                 "; ".join(f"{n}: {why}" for n, why in report.failed.items()))
    if report.rounds:
        store.save(key, result)
    else:  # nothing ran: the first candidate is taken for this process, and no answer is kept for others
        logs.log("autotune", "%s %s: no candidate ran; %s taken, nothing stored", op, signature, choice)
    COUNTS["measured"] += 1
    close = f"; {' and '.join(report.remeasured)} {report.extra_rounds} more" if report.remeasured else ""
    logs.log("autotune", "%s %s: %s (%s; %d rounds%s)", op, signature, choice,
             ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in times.items()), report.rounds, close)
    return result


def fastest(times: dict[str, float]) -> str:
    """The first candidate, in the given order, within `_TIE` of the fastest time."""
    best = min(times.values())
    return next(name for name, t in times.items() if t <= best * (1 + _TIE))


def clear_memory() -> None:
    """Forget this process's answers (tests: make the next question read the disk)."""
    _MEMORY.clear()
