"""Settled steps: the calls of kiln's decoding loop between which no Python but kiln's runs.

A compiled frame checks all of its guards on every call, and a frozen program stamps all of its
weights, because any Python that ran since the last call may have changed what they read: an
attribute, a global, a hook, a weight. Once kiln's decoding loop (kiln/capture/hf_greedy.py) has
settled (plain greedy search, the next inputs predicted by kiln, its own stopping checks, no
streamer, no hooks on the model), nothing runs between two decode steps but the loop's own code
and the compiled step itself. The loop then opens a run (`Run()`) and makes each step's call
under its mark (`call`). The first compiled frame the call reaches takes the mark (`take`: the
frames it reaches in turn see none), and where its entry was checked in full on two calls of the
same run it checks only the guards that read the call's new arguments
(kiln/capture/settled_entry.py); its frozen program, run under the mark again (`call`), stamps its weights
once a run (kiln/runtime/frozen.py). After a Qwen2-0.5B int4 step's 270 MB of weights the guard
check and the stamp ran from cold caches: ~150 and ~70 µs of a 9 ms token on a 2-core AMD EPYC.

Not seen: a change that another thread, or a finalizer the garbage collector runs between two
steps, makes to the model while the loop runs it (eager's next step would read it, racing with it;
the run's steps keep what the run began with). `config.capture.settled_steps`
(`KILN_SETTLED_STEPS=0`) turns the runs off.
"""

from __future__ import annotations

import contextvars
import itertools
from typing import Any, Callable

_NUMBERS = itertools.count(1)


class Run:
    """One settled loop's steps. `kept`: what each compiled frame keeps between its calls in the
    run (the arguments it last saw), dropped with the run; `number`: never given to another run in
    this process (a frozen program remembers the run it stamped in by it, holding nothing)."""

    __slots__ = ("number", "kept")

    def __init__(self) -> None:
        self.number = next(_NUMBERS)
        self.kept: dict[Any, Any] = {}


# The run whose step is being called in this thread (None: none); per thread, as a context variable.
_MARK: contextvars.ContextVar[Run | None] = contextvars.ContextVar("kiln_settled_run", default=None)


def call(run: Run, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` as a step of `run`: nothing but kiln's code ran since the run's last
    step (the loop's call of the model; a compiled entry's run, for its frozen program)."""
    token = _MARK.set(run)
    try:
        return fn(*args, **kwargs)
    finally:
        _MARK.reset(token)


def take() -> Run | None:
    """The run of the step this call is (None: none), taken: calls it makes in turn are none's."""
    run = _MARK.get()
    if run is not None:
        _MARK.set(None)
    return run


def current() -> Run | None:
    """The run whose step is running, or None."""
    return _MARK.get()
