"""The gemm suite: `kiln bench --suite gemm` times single GEMMs `a [M, K] @ b [K, N] + bias` through
every implementation of `kiln::mm` (`kiln.externs.prepacked.MM_IMPLS`, read when the suite runs, so
a new implementation appears without a change here) on the shapes of the hf suite's models, each
called as compiled graphs call it (`kiln.autotune.gemm.mm_call`: kiln's runtime's function itself).

As at freezing, each implementation packs the weight once (its first call, untimed); then rounds
of calls are interleaved across implementations, each round in a rotated order, and the median of
the rounds is kept, so a noisy neighbour slows every implementation alike. An implementation that
raises for a shape or dtype is "n/a"; one whose result differs from a float64 product is "wrong".
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, TextIO

import torch

from benchmarks.machine import OthersClock
from benchmarks.peak import Peak, machine_peak
from benchmarks.rounds import rotated


@dataclass(frozen=True)
class GemmShape:
    """One GEMM: `a [m, k] @ b [k, n]` (+ a bias of [n]), and the models that run it (calls per forward)."""

    m: int
    k: int
    n: int
    bias: bool = True
    models: str = ""

    @property
    def label(self) -> str:
        return f"{self.m}x{self.k}x{self.n}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n


# The linear layers of the hf suite's models at their bench inputs (batch 1; M = tokens, or pixels
# for ConvNeXt's pointwise layers), found by hooking every nn.Linear and GPT-2's Conv1D during one
# eager forward of each model in benchmarks/models.py; "bert 48" is 48 calls per BERT forward.
# Convolutions run through kiln::conv, not here.
SHAPES: list[GemmShape] = [
    GemmShape(128, 768, 768, True, "bert 48, distilbert 24, gpt2 12"),
    GemmShape(128, 768, 3072, True, "bert 12, gpt2 12, distilbert 6"),
    GemmShape(128, 3072, 768, True, "bert 12, gpt2 12, distilbert 6"),
    GemmShape(128, 768, 2304, True, "gpt2 12"),
    GemmShape(128, 768, 50257, False, "gpt2 1 (lm head)"),
    GemmShape(1, 768, 768, True, "bert 1, vit 1 (pooler)"),
    GemmShape(128, 512, 512, False, "t5 72, llama 16"),
    GemmShape(128, 512, 2048, False, "t5 12"),
    GemmShape(128, 2048, 512, False, "t5 12"),
    GemmShape(128, 512, 1376, False, "llama 8"),
    GemmShape(128, 1376, 512, False, "llama 4"),
    GemmShape(128, 512, 32000, False, "llama 1 (lm head)"),
    GemmShape(197, 768, 768, True, "vit 48"),
    GemmShape(197, 768, 3072, True, "vit 12"),
    GemmShape(197, 3072, 768, True, "vit 12"),
    GemmShape(3136, 96, 384, True, "convnext 3"),
    GemmShape(3136, 384, 96, True, "convnext 3"),
    GemmShape(784, 192, 768, True, "convnext 3"),
    GemmShape(784, 768, 192, True, "convnext 3"),
    GemmShape(196, 384, 1536, True, "convnext 9"),
    GemmShape(196, 1536, 384, True, "convnext 9"),
    GemmShape(49, 768, 3072, True, "convnext 3"),
    GemmShape(49, 3072, 768, True, "convnext 3"),
    GemmShape(1024, 144, 144, True, "mobilevit 8"),
    GemmShape(1024, 144, 288, True, "mobilevit 2"),
    GemmShape(1024, 288, 144, True, "mobilevit 2"),
    GemmShape(256, 192, 192, True, "mobilevit 16"),
    GemmShape(256, 192, 384, True, "mobilevit 4"),
    GemmShape(256, 384, 192, True, "mobilevit 4"),
    GemmShape(64, 240, 240, True, "mobilevit 12"),
    GemmShape(64, 240, 480, True, "mobilevit 3"),
    GemmShape(64, 480, 240, True, "mobilevit 3"),
    GemmShape(2048, 2048, 2048, False, "square (the peak's own GEMM)"),
]

DTYPES = ("float32", "bfloat16")
_SAMPLE_S = 0.004  # calls per sample are repeated to last this long, so the clock's grain does not count
# A result further than this from the float64 product (relative to its largest value) is wrong.
_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}


def parse_shapes(text: str) -> list[GemmShape]:
    """`"128x768x768,64x64x64"` as shapes (M x K x N, with a bias); ValueError naming the bad one."""
    shapes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            m, k, n = (int(v) for v in part.lower().split("x"))
        except ValueError:
            m = 0
        if m < 1 or k < 1 or n < 1:
            raise ValueError(f"--shapes takes MxKxN with positive sizes, e.g. 128x768x3072 (got {part!r})")
        shapes.append(GemmShape(m, k, n, True, "--shapes"))
    if not shapes:
        raise ValueError("--shapes names no shape")
    return shapes


@dataclass
class GemmResult:
    """One shape at one dtype and thread count: each implementation's median ms (None: n/a or
    wrong, see `notes`)."""

    shape: GemmShape
    dtype: str
    threads: int
    ms: dict[str, float | None] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # implementation -> "n/a: ..." or "wrong: ..."
    # The share of the machine's CPUs other processes used during the timed rounds: above a few
    # percent, every implementation's time in the row is inflated (their order holds: rounds interleave).
    others_cpu: float | None = None

    def gflops(self, impl: str) -> float | None:
        ms = self.ms.get(impl)
        return None if ms is None else self.shape.flops / (ms * 1e-3) / 1e9

    @property
    def fastest(self) -> str | None:
        timed = {name: ms for name, ms in self.ms.items() if ms is not None}
        return min(timed, key=timed.get) if timed else None

    def to_json(self) -> dict[str, Any]:
        # GFLOP/s and the fastest are derived, written for readers of the JSON, ignored when read back.
        gflops = {name: self.gflops(name) for name in self.ms}
        return {**asdict(self), "shape": asdict(self.shape), "gflops": gflops, "fastest": self.fastest}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GemmResult":
        known = {"dtype", "threads", "ms", "notes", "others_cpu"}
        return cls(shape=GemmShape(**data["shape"]), **{k: v for k, v in data.items() if k in known})


@dataclass
class GemmRun:
    """What the gemm suite measured: its results and the machine's peak at each thread count."""

    results: list[GemmResult]
    peaks: dict[int, Peak]

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results], "peaks": [asdict(p) for p in self.peaks.values()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GemmRun":
        peaks = [Peak(**p) for p in data.get("peaks", [])]
        return cls([GemmResult.from_json(r) for r in data["results"]], {p.threads: p for p in peaks})


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:200]


def _check(out: Any, expected: torch.Tensor, dtype: str) -> str | None:
    """Why `out` is not the product (None when it is)."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(expected.shape):
        return f"wrong: returned {getattr(out, 'shape', type(out).__name__)}, expected {tuple(expected.shape)}"
    err = (out.double() - expected).abs().max().item()
    scale = expected.abs().max().item() or 1.0
    if not err <= _TOLERANCE[dtype] * scale:  # NaN fails too
        return f"wrong: max error {err:.3g} (of max {scale:.3g})"
    return None


def _rounds(runs: dict[str, Callable[[], object]], reps: dict[str, int], rounds: int) -> tuple[dict[str, float], float]:
    """Median seconds per call of each run over `rounds` interleaved rounds, each round starting
    at the next run so that none always goes first (on caches the previous one left); and the
    share of the machine's CPUs other processes used meanwhile."""
    names = list(runs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock = OthersClock()
    for r in range(rounds):
        for name in rotated(names, r):
            run, n = runs[name], reps[name]
            start = time.perf_counter()
            for _ in range(n):
                run()
            samples[name].append((time.perf_counter() - start) / n)
    return {name: statistics.median(s) for name, s in samples.items()}, clock.share()


def measure(shape: GemmShape, dtype: str, threads: int, impls: dict[str, Callable], rounds: int, warmup: int) -> GemmResult:
    """Time `shape` at `dtype` through each of `impls` (name -> `(a, b, bias, unary, scalars, algorithm)`, as `mm_call` makes)."""
    from kiln.externs.prepacked import drop_packs

    result = GemmResult(shape, dtype, threads)
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    a = torch.randn(shape.m, shape.k, generator=g).to(dt)
    # The weight as a frozen nn.Linear leaves it: [N, K] contiguous, read transposed.
    b = torch.randn(shape.n, shape.k, generator=g).to(dt).t()
    bias = torch.randn(shape.n, generator=g).to(dt) if shape.bias else None
    expected = a.double() @ b.double() + (bias.double() if bias is not None else 0)
    runs, reps = {}, {}
    with torch.no_grad():
        for name, impl in impls.items():
            run = lambda impl=impl: impl(a, b, bias, "none", [], None)  # noqa: E731
            try:
                wrong = _check(run(), expected, dtype)  # the first call packs the weight, untimed
                for _ in range(warmup):
                    run()
                start = time.perf_counter()
                run()
                once = time.perf_counter() - start
            except Exception as e:  # noqa: BLE001 - a library without this dtype or shape: n/a
                result.ms[name], result.notes[name] = None, f"n/a: {_first_line(e)}"
                continue
            if wrong:
                result.ms[name], result.notes[name] = None, wrong
                continue
            runs[name], reps[name] = run, max(1, math.ceil(_SAMPLE_S / max(once, 1e-7)))
        medians, result.others_cpu = _rounds(runs, reps, rounds) if runs else ({}, None)
    drop_packs(b)
    result.ms.update({name: s * 1e3 for name, s in medians.items()})
    result.ms = {name: result.ms[name] for name in impls}  # the table's column order
    return result


def implementations() -> dict[str, Callable]:
    """Every implementation of kiln::mm (`kiln.externs.prepacked.MM_IMPLS`), each called as a
    compiled graph calls it: its call costs are part of a batch-1 GEMM's time."""
    from kiln.autotune.gemm import mm_call
    from kiln.externs.prepacked import MM_IMPLS

    return {name: mm_call(name) for name in MM_IMPLS}


def run_gemm_suite(shapes: list[GemmShape], threads: list[int], dtypes: list[str], rounds: int, warmup: int,
                   impls: dict[str, Callable] | None = None, progress: TextIO | None = sys.stderr) -> GemmRun:
    """Every shape at every dtype and thread count through every `kiln::mm` implementation; with
    the machine's peak at each thread count."""
    if impls is None:
        impls = implementations()
    before = torch.get_num_threads()
    results, peaks = [], {}
    total, done = len(shapes) * len(dtypes) * len(threads), 0
    try:
        for t in threads:
            peaks[t] = machine_peak(t)
            torch.set_num_threads(t)
            for shape in shapes:
                for dtype in dtypes:
                    result = measure(shape, dtype, t, impls, rounds, warmup)
                    results.append(result)
                    done += 1
                    if progress is not None:
                        progress.write(f"[{done}/{total}] {shape.label} {dtype} {t} thread{'s' if t > 1 else ''}: "
                                       f"{_verdict(result, peaks[t])}\n")
                        progress.flush()
    finally:
        torch.set_num_threads(before)
    return GemmRun(results, peaks)


def _verdict(result: GemmResult, peak: Peak) -> str:
    best = result.fastest
    if best is None:
        return "no implementation ran"
    top = peak.bf16_gflops if result.dtype == "bfloat16" else peak.gflops
    share = f" ({result.gflops(best) / top:.0%} of peak)" if top else ""
    shared = f", other processes used {result.others_cpu:.0%} of the CPUs" if (result.others_cpu or 0) > 0.05 else ""
    return f"fastest {best} {result.ms[best]:.3f} ms, {result.gflops(best):.0f} GFLOP/s{share}{shared}"
