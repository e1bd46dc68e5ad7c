"""Where a decode token's time goes around and inside kiln's graph: `generate` of an llm-suite
model under one of the suite's kiln modes, each decode step's wall time cut at the points kiln
passes through — the decoding loop between two steps, the frame's entry (binding the call's
arguments), its guard check, the way down to the frozen program, the frozen weights' stamp, the
graph, and the way back — as medians over the steps of every round; the steps' median, mean and
slowest, so that a mean raised by a few slow steps (the VM's neighbours) shows as such.

`--products` times the same step's quantized products alone (random weights of the model's shapes,
in one C call as kiln's C++ wrapper calls them: quant_decode_sweep.py's StepInC), once after each
`generate` round, on 2 MB pages read as kiln's runtime reads them on this CPU. They are the graph's
products but not exactly: gate and up as one plain product (the graph's reads them in pairs and
multiplies them in its epilogue), and no epilogue (the graph's add q/k/v's bias and o's and down's
residual and norm), so the graph's time less theirs bounds its other work (small kernels, attention,
the operators' calls, the threads' joins) only roughly.

    python benchmarks/tools/decode_breakdown.py --model qwen2-0.5b --mode kiln-int4 --rounds 4 --products

`--again` runs the guard check and the weights' stamp a second time at once after their timed call
and shows that run as a segment of its own: the first run's excess over it is what the cold caches
cost (a step that checks several entries' guards repeats each).

On a settled run's steps (kiln/settled.py) the guard check is that of the guards reading the
step's new arguments, and the stamp, skipped, counts as 0.

The cuts wrap kiln's own objects in this process (each FrameCache entry's guard check, each frozen
program's stamp and graph call, the model class's `__call__`) and put them back afterwards; each
wrapper costs ~0.1 µs, a few µs a step, and the wrapped step is not the suite's figure (`kiln bench
--suite llm` is).
"""
from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from benchmarks.llm import generate_options
from benchmarks.llm_modes import LLM_MODELS, LLM_MODES

# The cut points of one model call, in the order a call passes them: (name, start mark, end mark).
SEGMENTS = (
    ("entry: arguments bound", "call", "guards"),
    ("guard check", "guards", "guarded"),
    ("down to the frozen program", "guarded", "stamp"),
    ("frozen weights' stamp", "stamp", "stamped"),
    ("to the graph", "stamped", "graph"),
    ("graph", "graph", "graphed"),
    ("back to the loop", "graphed", "returned"),
)

# With `--again` the guard check and the weights' stamp, both only reads, run a second time at once
# after their timed call: what each costs with the caches its first run has just filled. After a
# decode step's weights (100-500 MB) nothing of theirs is left in any cache, and the first run pays
# for that (Qwen2-0.5B int4 on the Intel Xeon with AMX: the guard check 160-185 us, again 34-50).
AGAIN = {"guarded": ("guard check, run again at once", "guards_again", "guarded_again"),
         "stamped": ("frozen weights' stamp, run again at once", "stamp_again", "stamped_again")}


def step_segments(again: bool = False) -> tuple[tuple[str, str, str], ...]:
    """SEGMENTS, with `again` each of AGAIN's after the segment it repeats (the next one starting
    where the repeat ends: the repeats are no part of the others)."""
    if not again:
        return SEGMENTS
    out, follows = [], {}
    for name, start, end in SEGMENTS:
        out.append((name, follows.get(start, start), end))
        if end in AGAIN:
            out.append(AGAIN[end])
            follows[end] = AGAIN[end][2]
    return tuple(out)


# The marks a call's last one counts for (a segment's end after the call tried several entries' guards).
STAMP_MARKS = ("stamp", "stamped", "stamp_again", "stamped_again")
END_MARKS = frozenset({"guarded", "guarded_again", "stamped", "stamped_again", "graphed", "returned"})


@dataclass
class StepClock:
    """Marks (name, ns) of every model call while installed; `calls()` cuts them per call."""

    marks: list[tuple[str, int]] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list)

    def install(self, model: torch.nn.Module, again: bool = False) -> "StepClock":
        from kiln.capture import cache as frame_cache
        from kiln.capture.settled_entry import SettledEntry
        from kiln.runtime.frozen import FrozenProgram

        mark = self.marks.append
        ns = time.perf_counter_ns

        def around(owner: Any, name: str, before: str, after: str) -> None:
            inner = getattr(owner, name)
            had = name in vars(owner)
            repeat = AGAIN.get(after) if again else None

            def timed(*args: Any, **kwargs: Any) -> Any:
                mark((before, ns()))
                result = inner(*args, **kwargs)
                mark((after, ns()))
                if repeat is not None:
                    mark((repeat[1], ns()))
                    inner(*args, **kwargs)
                    mark((repeat[2], ns()))
                return result

            setattr(owner, name, timed)
            self._undo.append((lambda: setattr(owner, name, inner)) if had else (lambda: delattr(owner, name)))

        for cache in frame_cache.all_caches():
            for entry in cache.entries:
                around(entry.guards, "check", "guards", "guarded")
        # (a settled run's step checks the guards that read its new arguments: its guard check)
        around(SettledEntry, "holds", "guards", "guarded")
        with warnings.catch_warnings():  # (isinstance on every live object touches deprecated module proxies)
            warnings.simplefilter("ignore")
            programs = [o for o in gc.get_objects() if isinstance(o, FrozenProgram)]
        for program in programs:
            around(program, "stamp_of", "stamp", "stamped")
            around(program, "_run_with_constants", "graph", "graphed")
        cls = type(model)
        call = cls.__call__

        def timed_call(module: Any, *args: Any, **kwargs: Any) -> Any:
            mark(("call", ns()))
            result = call(module, *args, **kwargs)
            mark(("returned", ns()))
            return result

        own = "__call__" in vars(cls)
        cls.__call__ = timed_call
        self._undo.append((lambda: setattr(cls, "__call__", call)) if own else (lambda: delattr(cls, "__call__")))
        return self

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def calls(self) -> list[dict[str, int]]:
        """Per model call, each mark's time: a start mark's first, an end mark's last (a call
        tries the guards of several entries: from the first check's start to the last's end)."""
        calls, current = [], {}
        for name, at in self.marks:
            if name == "graph" and "stamp" not in current:  # a settled run's step: no stamp (kiln/settled.py)
                current.update({mark: at for mark in STAMP_MARKS})
            if name in END_MARKS or name not in current:
                current[name] = at
            if name == "returned":
                calls.append(current)
                current = {}
        return calls


@dataclass
class Breakdown:
    """Medians in µs of each segment over the decode steps (every call after a generate's first)."""

    segments: dict[str, float]
    loop_us: float  # from a step's return to the next step's call: kiln's (or HF's) decoding loop
    step_ms: list[float]  # call to call, every decode step of every round

    def lines(self) -> list[str]:
        out = [f"  {'decoding loop, between steps':40s} {self.loop_us:9.1f} us"]
        out += [f"  {name:40s} {us:9.1f} us" for name, us in self.segments.items()]
        steps = sorted(self.step_ms)
        slowest = ", ".join(f"{s:.1f}" for s in steps[-3:])
        out.append(f"  steps: median {statistics.median(steps):.2f} ms, mean {statistics.fmean(steps):.2f}, "
                   f"90th percentile {steps[math.ceil(0.9 * len(steps)) - 1]:.2f}, slowest {slowest} ({len(steps)} steps)")
        return out


def breakdown(rounds: list[list[dict[str, int]]], again: bool = False) -> Breakdown:
    """The segments of every decode step of `rounds` (each a generate's calls, the prefill first);
    `again`: with AGAIN's repeats (StepClock.install(again=True))."""
    decode = [(prev, call) for calls in rounds for prev, call in zip(calls[1:], calls[2:])]
    steps = [call for calls in rounds for call in calls[1:]]
    segments = {}
    for name, start, end in step_segments(again):
        spans = [c[end] - c[start] for c in steps if start in c and end in c]
        if spans:
            segments[name] = statistics.median(spans) / 1e3
    loop = statistics.median(call["call"] - prev["returned"] for prev, call in decode) / 1e3 if decode else 0.0
    step_ms = [(call["call"] - prev["call"]) / 1e6 for prev, call in decode]
    return Breakdown(segments, loop, step_ms)


def _products_step(model_name: str, bits: str) -> tuple[Callable[[], float], Callable[[], None]]:
    """(run, restore): `run()` times the model's decode products once in one C call, in ms."""
    from benchmarks import kernels
    from benchmarks.tools import quant_decode_sweep as sweep

    lib = kernels.library()
    torch.manual_seed(0)
    weights = []
    for k, n in sweep.layer_shapes(model_name):
        w, group = torch.randn(n, k) * 0.02, min(sweep.GROUP, k)
        pack = kernels.quant_pack(*sweep._int4(w, group), 4, group, k, lib) if bits == "int4" else \
            kernels.quant_pack(*sweep._int8(w), 8, k, k, lib)
        weights.append((k, n, group, pack))
    arena = sweep.HugePageArena(sum(sweep.HugePageArena.room(p) for *_, p in weights))
    packs = [(k, n, group, {bits: arena.copy_of(p)}) for k, n, group, p in weights]
    acts = {k: torch.randn(1, k) for k in {k for k, *_ in packs}}
    step = sweep.StepInC(packs, acts, bits, argparse.Namespace(read_runs=2, read_ahead=3072, rows=1))
    # Read as kiln's runtime reads its packs on this CPU (one stream a thread on AMD, runs on Intel:
    # kiln_runtime.cpp sets huge_page_packs where 2 MB pages are allowed).
    from kiln.native import libkiln

    before = lib.kiln_gemm_huge_page_packs()
    lib.kiln_gemm_set_huge_page_packs(int(libkiln.library().kiln_huge_page_reads()))
    step.run(lib)  # (the first call's lazy binding and page faults are not the step's)
    return (lambda: step.run(lib) * 1e3), (lambda: lib.kiln_gemm_set_huge_page_packs(before))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2-0.5b", choices=sorted(LLM_MODELS))
    kiln_modes = sorted(name for name in LLM_MODES if name.startswith("kiln"))
    parser.add_argument("--mode", default="kiln-int4", choices=kiln_modes)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens a generate")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--again", action="store_true",
                        help="also run the guard check and the weights' stamp a second time at once after each "
                             "(their cost with warm caches; the steps are then that much longer)")
    parser.add_argument("--products", action="store_true",
                        help="also time the step's quantized products alone (int8 and int4 modes)")
    args = parser.parse_args(argv)
    mode = LLM_MODES[args.mode]
    if args.products and mode.weights not in ("int8", "int4"):
        parser.error(f"--products times quantized products: --mode {args.mode} stores {mode.weights} weights")
    torch.set_num_threads(args.threads)
    model = LLM_MODELS[args.model].build()
    runner = mode.prepare(model)
    prompt = torch.randint(0, LLM_MODELS[args.model].config["vocab_size"], (1, args.prompt))
    options = generate_options(args.new)

    def generate() -> None:
        with torch.no_grad(), mode.context():
            runner.generate(prompt, attention_mask=torch.ones_like(prompt), **options)

    for _ in range(2):  # compiled, frozen, packed; then once warm
        generate()
    products, restore = _products_step(args.model, mode.weights) if args.products else (None, lambda: None)
    clock = StepClock().install(model, again=args.again)
    rounds, products_ms = [], []
    try:
        for _ in range(args.rounds):
            clock.marks.clear()
            generate()
            rounds.append(clock.calls())
            if products is not None:
                products_ms.append(products())
    finally:
        clock.uninstall()
        restore()
    result = breakdown(rounds, again=args.again)
    print(f"{args.model} · {args.mode} · {args.threads} threads: prompt {args.prompt}, {args.new} new tokens, "
          f"{args.rounds} rounds; medians over the decode steps")
    print("\n".join(result.lines()))
    if products_ms:
        graph = result.segments.get("graph")
        print(f"  the step's {mode.weights} products alone (one C call, random weights, interleaved): "
              f"median {statistics.median(products_ms):.2f} ms"
              + (f"; the graph less them {graph / 1e3 - statistics.median(products_ms):.2f} ms" if graph else ""))


if __name__ == "__main__":
    main()
