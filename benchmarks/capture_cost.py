"""What kiln's own capture costs per model: capture time, guards, and per-call overhead.

    kiln capture-cost --suite hf

For each model: the time to capture one graph (the first call of `kiln.compile(model)` with a
backend that runs the graph as it is, minus that graph's own run, timed inside it), the number of guards, the time of one guard check, the dispatch
(binding the arguments and checking the guards: what a call costs before the graph runs), and the
whole per-call overhead around the graph (dispatch, reading the graph's inputs, replaying side
effects, building the returned structure, which for a HuggingFace model is a `ModelOutput` that
eager's forward builds too) measured with a backend whose "graph" returns at once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from benchmarks.models import MODELS, chosen_models


def _median_us(fn: Any, repeats: int = 2000) -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        samples.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(samples)


class _TimedGraph:
    """A backend that runs the captured graph as it is and keeps the seconds of its runs: the
    first call's capture time is the call's less the graph's run, both taken in that one call (an
    eager call timed apart, on a loaded machine, can outlast the whole capture of a small model)."""

    def __init__(self) -> None:
        self.run_s = 0.0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return gm(*args)
            finally:
                self.run_s += time.perf_counter() - start
        return run


def _instant_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
    outputs = gm(*example_inputs)  # computed once; the timed calls cost only kiln's own Python
    return lambda *args: outputs


def measure(name: str) -> dict[str, Any]:
    import kiln

    spec = MODELS[name]
    model, inputs = spec.build(False), spec.make_inputs()
    with torch.no_grad():
        expected = model(**inputs)  # (the first call pays one-time costs the compiled call's graph does not)
        timed = _TimedGraph()
        compiled = kiln.compile(model, backend=timed, fullgraph=True)
        start = time.perf_counter()
        compiled(**inputs)
        capture_s = time.perf_counter() - start - timed.run_s
        cache = compiled.kiln_cache
        entry = cache.entries[0]
        bound = cache.binder(**inputs)
        guard_us = _median_us(lambda: entry.guards.check(bound))
        dispatch_us = _median_us(lambda: entry.guards.check(cache.binder(**inputs)))
        instant = kiln.compile(model, backend=_instant_backend, fullgraph=True)
        instant(**inputs)
        call_us = _median_us(lambda: instant(**inputs), repeats=500)
    del expected
    return {"model": name, "capture_s": capture_s, "ops": entry.stats["ops"], "guards": entry.stats["guards"],
            "guard_check_us": guard_us, "dispatch_us": dispatch_us, "call_overhead_us": call_us}


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        names = chosen_models(args.suite, args.models)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    print("| model | capture s | graph ops | guards | guard check µs | dispatch µs | call overhead µs |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        r = measure(name)
        print(f"| {r['model']} | {r['capture_s']:.2f} | {r['ops']} | {r['guards']} | {r['guard_check_us']:.1f} "
              f"| {r['dispatch_us']:.1f} | {r['call_overhead_us']:.1f} |", flush=True)
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("capture-cost", help="capture time, guards and per-call overhead of kiln.compile per model")
    parser.add_argument("--suite", default=None, help="a model suite, e.g. hf or smoke")
    parser.add_argument("--models", default="bert", help="comma-separated model names (without --suite)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the overhead is single-threaded Python)")
    parser.set_defaults(handler=main)
