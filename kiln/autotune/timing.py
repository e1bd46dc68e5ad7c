"""How long each candidate takes, measured so that a noisy machine misleads as little as it can.

    seconds, report = interleaved_seconds({"aten": run_a, "mkl": run_b}, budget_s=0.25)

The candidates run in rounds, each candidate once a round and the starting one rotating (A B C,
B C A, C A B, ...), and each gets the median of its rounds. On a 2-core machine shared with other
work, noise comes in bursts (another process scheduled on one core stalls both OpenMP threads);
timing one candidate after the other puts a whole burst on whichever ran then, while interleaved
rounds spread it over all of them alike. It is also closer to how a GEMM runs in a model: after
other work has evicted its weight from the caches, not straight after itself.

When the best two end within `CLOSE` of each other, those two alone run more rounds and their
medians are taken over all their rounds, so the decision rests on more samples where it is close.

A candidate that raises RuntimeError in its warm-up (a library without that dtype or layout) is
out: its time is infinite.
"""

from __future__ import annotations

import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

# Best two closer than this (relative) are measured again, alone, before deciding.
CLOSE = 0.05

# The clock; a module attribute so tests can replace it with one that candidates advance.
_clock = time.perf_counter

Timer = Callable[[Callable[[], object]], float]  # runs a candidate once, returns the seconds it took


def host_seconds(run: Callable[[], object]) -> float:
    """The host's clock around one run: what a CPU kernel takes (the default timer)."""
    start = _clock()
    run()
    return _clock() - start


# GPU cycles per second the host's launches are given to queue up behind (an over-estimate of an
# H100's or H200's clock: sleeping too long costs only the measurement's time).
_GPU_CYCLES_PER_S = 2.0e9


def gpu_seconds(run: Callable[[], object]) -> float:
    """The GPU's own time for one run's kernels, by CUDA events on the current stream, without
    the host's time to launch them: the stream is first held by a spin kernel
    (`torch.cuda._sleep`) twice as long as the host took to launch the run last time, so every
    launch is queued before the start event is reached. Timing the host instead -- launches plus
    a synchronize -- lets the form with fewer Python launches win even when its kernels are the
    slower ones, and under CUDA graphs, where the launches cost nothing, the slower kernel stays."""
    import torch

    launch_s = _LAUNCH_SECONDS.get(run)
    if launch_s is None:  # (the first run of a candidate is its warm-up)
        host_start = time.perf_counter()
        run()
        _LAUNCH_SECONDS[run] = time.perf_counter() - host_start
        torch.cuda.synchronize()
        launch_s = _LAUNCH_SECONDS[run]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2 * launch_s * _GPU_CYCLES_PER_S) + 1000)
    start.record()
    host_start = time.perf_counter()
    run()
    _LAUNCH_SECONDS[run] = time.perf_counter() - host_start
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


_LAUNCH_SECONDS: "weakref.WeakKeyDictionary[Callable, float]" = weakref.WeakKeyDictionary()


@dataclass
class Report:
    """What the measurement did, for the log and the stored answer."""

    rounds: int = 0  # rounds of all candidates
    remeasured: list[str] = field(default_factory=list)  # the close two, when they ran more rounds
    extra_rounds: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # candidates whose warm-up raised: the error's first line


def interleaved_seconds(runs: dict[str, Callable[[], object]], budget_s: float, min_rounds: int = 3,
                        max_rounds: int = 15, timer: Timer = host_seconds) -> tuple[dict[str, float], Report]:
    """Each candidate's median seconds over interleaved rounds, run until the timed runs add up to
    `budget_s` (at least `min_rounds`, at most `max_rounds` rounds), then the close call's extra
    rounds (a fraction of the budget more). A slow candidate (a 50,000-wide vocabulary projection)
    so costs a few rounds, a fast one many. `timer` measures one run (`gpu_seconds` for GPU
    kernels)."""
    report = Report()
    samples: dict[str, list[float]] = {}
    for name, run in runs.items():
        try:
            run()  # warm-up: first-touch page faults, library dispatch caches, packing done on first call
        except RuntimeError as error:  # (a candidate this shape or machine cannot run: left out, said why)
            report.failed[name] = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
            continue
        samples[name] = []
    live = list(samples)
    if live:
        report.rounds = _rounds(runs, live, samples, budget_s, min_rounds, max_rounds, timer)
    seconds = {name: statistics.median(samples[name]) if name in samples else float("inf") for name in runs}
    close = _close_two(seconds)
    if close is not None:
        # Rounds of the two alone, each of them cheaper than a round of all: up to as many again.
        report.remeasured = close
        report.extra_rounds = _rounds(runs, close, samples, budget_s * 0.4, min_rounds, max_rounds, timer)
        seconds.update({name: statistics.median(samples[name]) for name in close})
    return seconds, report


def _rounds(runs: dict[str, Callable[[], object]], names: list[str], samples: dict[str, list[float]], budget_s: float,
            min_rounds: int, max_rounds: int, timer: Timer) -> int:
    """Run rounds of `names` into `samples`; the number of rounds run."""
    spent, done = 0.0, 0
    while done < max_rounds and (done < min_rounds or spent < budget_s):
        start_at = done % len(names)
        for name in names[start_at:] + names[:start_at]:
            elapsed = timer(runs[name])
            samples[name].append(elapsed)
            spent += elapsed
        done += 1
    return done


def _close_two(seconds: dict[str, float]) -> list[str] | None:
    """The fastest two, in the candidates' order, when they are within `CLOSE` of each other."""
    finite = sorted((t, i, name) for i, (name, t) in enumerate(seconds.items()) if t != float("inf"))
    if len(finite) < 2 or finite[1][0] > finite[0][0] * (1 + CLOSE):
        return None
    return [name for _, _, name in sorted(finite[:2], key=lambda entry: entry[1])]
