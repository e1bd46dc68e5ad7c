"""Where the time of a compiled call goes: each kernel's and extern's time, FLOPs and bytes, and
the fraction of the machine's peak it reached (a roofline table per compiled graph).

    import kiln
    from benchmarks.profile import profile, format_profile

    model = kiln.compile(model)              # or torch.compile(model, backend="kiln")
    report = profile(model, x, iters=20)     # compiles on its first call if not done yet
    print(format_profile(report))

How it measures: the model is called once, and the kiln graphs that call runs are found among the
live `CompiledGraph`s (kiln/runtime/compiled_graph.py `LIVE`), so graphs compiled earlier, or
loaded from the AOT graph cache, are found too. Each graph's wrapper is defined a second time
with a `perf_counter` pair around every kernel, extern op and layout copy
(`CompiledGraph.instrumented`); the normal wrapper is untouched, so profiling off costs nothing.
Plain and instrumented calls of the whole model then alternate, `iters` of each, as `kiln bench`
alternates eager and compiled calls. Times are means over the half of the calls nearest their
median ("near-median means"): the whole call's over the plain calls; an entry's over the
instrumented calls whose total is among the half nearest the instrumented calls' median. Like a
median it ignores the calls a busy machine slowed (and stays with the median's mode when a busy
machine makes the times bimodal), and unlike per-entry medians the entries' times add up: the sum
of per-entry medians falls short of the median call whenever each step is slowed now and then,
and some step is slowed in most calls. What the entries do not cover (the Python wrapper's own lines: allocations, `data_ptr()`, `del`; the
freezing check; guards; eager code between graphs) is printed as "unaccounted".

FLOPs and bytes: benchmarks/profile_costs.py. Peak GFLOP/s and GB/s: `benchmarks.peak.machine_peak`
(a large GEMM and a large copy, measured once per machine and thread count, and cached).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from benchmarks.profile_costs import Cost, extern_cost, kernel_cost, layout_copy_cost, unknown_kernel_cost
from kiln.runtime.compiled_graph import LIVE, CompiledGraph

class NoKilnGraph(ValueError):
    """The profiled call ran no graph compiled by kiln's backend."""


MEASURE = "measure"  # `profile(peak=MEASURE)`: ask benchmarks.peak for the machine's peak


@dataclass
class Entry:
    """One kernel, extern op or the layout copies of one graph, per model call."""

    step: str  # the wrapper's name for it: a kernel name, op<step>, _in_layout
    kind: str  # kernel, gemm, conv, attention, aten, view, layout copy
    what: str
    calls: int  # calls per model call
    ms: float  # time per model call, all its calls together (near-median mean, see above)
    flops: int | None  # per model call; None when not known
    bytes: int | None
    dtype: str | None = None  # an extern's operands' dtype (kernels: None)

    @property
    def gflops_per_s(self) -> float | None:
        return self.flops / self.ms / 1e6 if self.flops is not None and self.ms > 0 else None

    @property
    def gb_per_s(self) -> float | None:
        return self.bytes / self.ms / 1e6 if self.bytes is not None and self.ms > 0 else None

    def peak_gflops(self, peak: dict) -> float:
        """The compute roof: bfloat16 GEMMs have their own (AMX, avx512_bf16) where it was measured."""
        return (self.dtype == "bfloat16" and peak.get("bf16_gflops")) or peak["gflops"]

    def bound(self, peak: dict | None) -> str | None:
        """"compute" when the entry's FLOPs per byte exceed the machine's balance (peak GFLOP/s
        over peak GB/s), else "memory": the roof it is measured against."""
        if peak is None or self.bytes is None or self.flops is None or not (self.flops or self.bytes):
            return None
        if not self.bytes:
            return "compute"
        return "compute" if self.flops / self.bytes > self.peak_gflops(peak) / peak["gbps"] else "memory"

    def peak_fraction(self, peak: dict | None) -> float | None:
        bound = self.bound(peak)
        if bound == "compute" and self.gflops_per_s is not None:
            return self.gflops_per_s / self.peak_gflops(peak)
        if bound == "memory" and self.gb_per_s is not None:
            return self.gb_per_s / peak["gbps"]
        return None


@dataclass
class GraphProfile:
    index: int  # in the order the model's call first runs the graphs
    label: str
    entries: list[Entry] = field(default_factory=list)

    @property
    def ms(self) -> float:
        return sum(e.ms for e in self.entries)


@dataclass
class Profile:
    graphs: list[GraphProfile]
    call_ms: float  # the plain (uninstrumented) whole calls' near-median mean
    timed_call_ms: float  # the instrumented whole calls' near-median mean
    iters: int
    threads: int
    timer_us: float  # what one timed entry costs the instrumented call, measured
    peak: dict | None  # gflops, gbps, cpu, threads, bf16_gflops (benchmarks.peak); None when not measured
    call_median_ms: float | None = None  # the plain whole calls' median, as kiln bench reports

    @property
    def entries_ms(self) -> float:
        return sum(g.ms for g in self.graphs)

    @property
    def unaccounted_ms(self) -> float:
        return self.call_ms - self.entries_ms

    @property
    def timed_entries(self) -> int:
        return sum(e.calls for g in self.graphs for e in g.entries)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Profile":
        graphs = [GraphProfile(g["index"], g["label"], [Entry(**e) for e in g["entries"]]) for g in data["graphs"]]
        return cls(**{**data, "graphs": graphs})


# ---- finding the graphs a call runs ------------------------------------------------------------

def graphs_run_by(fn: Callable, args: tuple, kwargs: dict) -> list[CompiledGraph]:
    """The live CompiledGraphs one call of `fn` runs, in the order it first runs them."""
    seen: list[CompiledGraph] = []
    graphs = list(LIVE)

    def spy(graph: CompiledGraph, call: Callable) -> Callable:
        def run(*a: Any) -> Any:
            if all(g is not graph for g in seen):
                seen.append(graph)
            return call(*a)
        return run

    originals = [g.call for g in graphs]
    for graph, call in zip(graphs, originals):
        graph.call = spy(graph, call)
    try:
        fn(*args, **kwargs)
    finally:
        for graph, call in zip(graphs, originals):
            graph.call = call
    return seen


# ---- the cost pass: what each step is and costs, from one call -------------------------------

def _qualified(graph: CompiledGraph, name: str, op: Any) -> str:
    return graph.artifact.ops.get(name) or getattr(op, "__name__", None) or str(op)


def _kernel_costs(graph: CompiledGraph) -> dict[str, Cost]:
    schedule = graph.schedule
    if schedule is None:
        return {name: unknown_kernel_cost() for name in graph.kernels}
    vectorized = graph.stages.kernels.vectorized
    return {k.name: kernel_cost(k, vectorized.get(k.name)) for k in schedule.kernels}


class _CostPass:
    """Wraps every step of one graph to count its calls and note its cost on the first call."""

    def __init__(self, graph: CompiledGraph) -> None:
        self.graph = graph
        self.kernels = _kernel_costs(graph)
        self.costs: dict[str, Cost] = {}
        self.calls: dict[str, int] = {}
        self.copied = 0

    def wrap(self, name: str, fn: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            self.calls[name] = self.calls.get(name, 0) + 1
            if name == "_in_layout":
                if out is not args[0]:
                    self.copied += 2 * out.numel() * out.element_size()  # read and written
            elif name in self.kernels:
                self.costs.setdefault(name, self.kernels[name])
            elif name not in self.costs:
                self.costs[name] = extern_cost(_qualified(self.graph, name, fn), fn, args, kwargs, out)
            return out
        return run

    def cost(self, name: str) -> Cost:
        return layout_copy_cost(self.copied) if name == "_in_layout" else self.costs[name]


# ---- timing ---------------------------------------------------------------------------------

class _Timers:
    """One accumulator per step of every graph; a timed step adds its seconds to its slot."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, str]] = []
        self.seconds: list[float] = []

    def wrap(self, key: tuple[int, str], fn: Callable) -> Callable:
        slot = len(self.keys)
        self.keys.append(key)
        self.seconds.append(0.0)
        seconds, clock = self.seconds, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            out = fn(*args, **kwargs)
            seconds[slot] += clock() - start
            return out
        return timed

    def take(self) -> list[float]:
        taken = list(self.seconds)
        self.seconds[:] = [0.0] * len(taken)
        return taken


def timer_overhead_us(n: int = 20000) -> float:
    """Microseconds one timed step adds to a call: a timed no-op against a bare one."""
    def noop() -> None:
        return None

    timed = _Timers().wrap((0, "noop"), noop)
    best = []
    for f in (noop, timed):
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                f()
            samples.append(time.perf_counter() - start)
        best.append(min(samples))
    return max(0.0, (best[1] - best[0]) / n * 1e6)


def _near_median(samples: list[float]) -> list[int]:
    """The positions of the half of `samples` nearest their median (at least one)."""
    median = statistics.median(samples)
    order = sorted(range(len(samples)), key=lambda i: abs(samples[i] - median))
    return order[:max(1, (len(samples) + 1) // 2)]


def _near_median_mean(samples: list[float]) -> float:
    near = _near_median(samples)
    return sum(samples[i] for i in near) / len(near)


def _swap(graphs: list[CompiledGraph], calls: list[Callable]) -> None:
    for graph, call in zip(graphs, calls):
        graph.call = call


def _machine_peak(threads: int) -> dict | None:
    try:
        from benchmarks.peak import machine_peak
    except ImportError:  # the peak measurement is not part of this checkout
        return None
    p = machine_peak(threads)
    return {"gflops": p.gflops, "gbps": p.gbps, "cpu": p.cpu, "threads": p.threads,
            "bf16_gflops": getattr(p, "bf16_gflops", None)}


def profile(fn: Callable, *args: Any, iters: int = 20, warmup: int = 3, peak: Any = MEASURE,
            **kwargs: Any) -> Profile:
    """Profile `fn(*args, **kwargs)`, a model compiled by kiln (either door), per kiln graph.

    peak: the machine's peak as {"gflops", "gbps", "cpu", "threads"[, "bf16_gflops"]}, MEASURE (the default) to ask
    `benchmarks.peak.machine_peak`, or None for no roofline columns.

    Example::

        report = profile(kiln.compile(model), x)
        print(format_profile(report))
    """
    fn(*args, **kwargs)  # compiles, if it has not yet
    graphs = graphs_run_by(fn, args, kwargs)
    if not graphs:
        raise NoKilnGraph("no kiln-compiled graph ran in this call: profile a model compiled by kiln.compile "
                         "or torch.compile(backend=\"kiln\") (graphs that fell back to eager are not profiled)")
    plain = [g.call for g in graphs]
    passes = [_CostPass(g) for g in graphs]
    _swap(graphs, [g.instrumented(p.wrap) for g, p in zip(graphs, passes)])
    try:
        fn(*args, **kwargs)
    finally:
        _swap(graphs, plain)

    timers = _Timers()
    instrumented = [g.instrumented(lambda name, f, i=i: timers.wrap((i, name), f)) for i, g in enumerate(graphs)]
    plain_s, timed_s, per_step = _alternate(lambda: fn(*args, **kwargs), graphs, plain, instrumented, timers,
                                            iters, warmup)
    near = _near_median(timed_s)
    means = [sum(per_step[i][slot] for i in near) / len(near) * 1e3 for slot in range(len(timers.keys))]
    timed_ms = dict(zip(timers.keys, means))
    threads = torch.get_num_threads()
    return Profile([_graph_profile(i, g, p, timed_ms) for i, (g, p) in enumerate(zip(graphs, passes))],
                   _near_median_mean(plain_s) * 1e3, _near_median_mean(timed_s) * 1e3, iters, threads, timer_overhead_us(),
                   _machine_peak(threads) if peak == MEASURE else peak, statistics.median(plain_s) * 1e3)


def _alternate(call: Callable[[], Any], graphs: list[CompiledGraph], plain: list[Callable],
               instrumented: list[Callable], timers: _Timers, iters: int, warmup: int) -> tuple[list, list, list]:
    """Seconds of `iters` plain and `iters` instrumented calls, alternated, and each instrumented
    call's seconds per step."""
    def run_plain() -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    def run_timed() -> float:
        _swap(graphs, instrumented)
        try:
            timers.take()
            start = time.perf_counter()
            call()
            return time.perf_counter() - start
        finally:
            _swap(graphs, plain)

    for _ in range(warmup):
        run_plain(), run_timed()
    plain_s, timed_s, per_step = [], [], []
    for i in range(iters):
        # Alternate which goes first, as kiln bench does, so neither always runs on warmed caches.
        for run in ((run_plain, run_timed) if i % 2 == 0 else (run_timed, run_plain)):
            seconds = run()
            if run is run_plain:
                plain_s.append(seconds)
            else:
                timed_s.append(seconds)
                per_step.append(timers.take())
    return plain_s, timed_s, per_step


def _graph_profile(index: int, graph: CompiledGraph, costs: _CostPass, timed_ms: dict) -> GraphProfile:
    entries = []
    for name, calls in costs.calls.items():
        if name == "_in_layout" and not costs.copied:
            continue  # layout checks that copied nothing: their time is unaccounted
        cost = costs.cost(name)
        scale = calls if name != "_in_layout" else 1  # the copies were summed over calls already
        entries.append(Entry(name, cost.kind, cost.what, calls, timed_ms[(index, name)],
                             None if cost.flops is None else cost.flops * scale,
                             None if cost.bytes is None else cost.bytes * scale, cost.dtype))
    entries.sort(key=lambda e: -e.ms)
    externs = sum(1 for name in costs.calls if name != "_in_layout" and name not in graph.kernels)
    return GraphProfile(index, f"graph {index}: {len(graph.kernels)} kernels, {externs} extern calls", entries)


def profile_step(step: Callable[[], Any], iters: int, warmup: int) -> dict | None:
    """What `kiln bench --profile` records for one case: the profile of `step()` (the compiled
    model's call) as JSON, or None for a mode that runs no kiln graph (eager, Inductor)."""
    try:
        return profile(step, iters=iters, warmup=warmup).to_json()
    except NoKilnGraph:
        return None
