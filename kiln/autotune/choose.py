"""Pick the fastest of a few candidates, measured once per question and remembered on disk."""

from __future__ import annotations

from typing import Any, Callable

from kiln import compile_time, logs
from kiln.autotune import store
from kiln.autotune.timing import median_seconds

# Within this fraction of the fastest, the earlier candidate (the simpler one) is kept: closer
# timings are noise on a shared machine, and a needless library switch is a risk for nothing.
_TIE = 0.03

# Results measured in this process, so a question asked by many graphs is answered once.
_MEMORY: dict[str, dict[str, Any]] = {}
# Questions answered by measuring and from the caches, for `kiln autotune`'s report.
COUNTS = {"measured": 0, "cached": 0}


def choose(op: str, signature: Any, candidates: dict[str, Callable[[], object]], budget_s: float = 0.2,
           after_each: Callable[[], None] | None = None) -> str:
    """The name of the fastest candidate for `signature` (anything with a stable repr: shapes,
    dtypes, flags). Candidates run with inputs the caller prepared; the first one wins ties.
    `after_each` runs after each candidate's timing (to free what it allocated)."""
    names = list(candidates)
    if len(names) == 1:
        return names[0]
    key = store.question_key(op, signature, names)
    result = _MEMORY.get(key) or store.load(key)
    if result is None or result["choice"] not in candidates:
        with store.locked(key):
            result = _measured(op, signature, key, candidates, budget_s, after_each)
    else:
        COUNTS["cached"] += 1
    _MEMORY[key] = result
    return result["choice"]


def _measured(op: str, signature: Any, key: str, candidates: dict[str, Callable[[], object]], budget_s: float,
              after_each: Callable[[], None] | None) -> dict[str, Any]:
    """The answer to question `key`: another process's, when it measured while this one waited
    for the lock; else measured now and saved."""
    names = list(candidates)
    result = store.load(key)
    if result is not None and result["choice"] in candidates:
        COUNTS["cached"] += 1
        return result
    times = {}
    with compile_time.stage("autotune", merge=True) as timed:
        for name, run in candidates.items():
            try:
                times[name] = median_seconds(run, budget_s)
            except RuntimeError:  # this library cannot run it (a dtype, a layout): out
                times[name] = float("inf")
            if after_each is not None:
                after_each()
        timed.notes[:] = [f"{timed.entries} question{'s' if timed.entries > 1 else ''} measured"]
    best = min(times.values())
    choice = next(name for name in names if times[name] <= best * (1 + _TIE))
    result = {"op": op, "signature": repr(signature), "choice": choice, "seconds": times}
    store.save(key, result)
    COUNTS["measured"] += 1
    logs.log("autotune", "%s %s: %s (%s)", op, signature, choice,
             ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in times.items()))
    return result


def clear_memory() -> None:
    """Forget this process's answers (tests: make the next question read the disk)."""
    _MEMORY.clear()
