"""Soak: a small compiled model called many times with changing inputs, its memory measured.

Resident memory (psutil when installed, else /proc/self/statm) and the Python heap (tracemalloc,
optional: it slows every allocation) are read after a warm-up that compiles every batch size and
fills the allocators, then every `--every` calls, then at the end; growth is end minus warm-up.
Every `--check-every` calls the output is compared with eager's.

    python -m tests.runtime.soak --calls 10000            # the benchmark size; figures printed
    python -m tests.runtime.soak --calls 10000 --eager    # the same loop without kiln: the noise floor

tests/runtime/test_soak.py runs `soak` with fewer calls.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import tracemalloc
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

import kiln


class Mlp(nn.Module):
    """Linear-GELU-Linear-LayerNorm: GEMMs (autotuned), a fused pointwise kernel, a reduction."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(width, 4 * width), nn.Linear(4 * width, width), nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.down(nn.functional.gelu(self.up(x))) + x)


class _Discard:
    """A file that keeps nothing: the print below must break the graph without filling a buffer."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


_DISCARD = _Discard()


class WithBreak(Mlp):
    """The same model with a graph break in the middle: two graphs and a resume function per call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.up(x))
        print("hidden", file=_DISCARD)  # an effect kiln does not replay: a graph break that resumes
        return self.norm(self.down(h) + x)


MODELS = {"mlp": Mlp, "break": WithBreak}


def rss_bytes() -> int:
    """This process's resident memory."""
    try:
        import psutil
    except ImportError:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return psutil.Process().memory_info().rss


@dataclass
class SoakResult:
    model: str
    compiled: bool
    calls: int
    seconds: float
    rss_warm: int  # bytes, after the warm-up
    rss_end: int
    rss_samples: list[int] = field(default_factory=list)  # every `every` calls
    heap_warm: int | None = None  # Python heap (tracemalloc), when traced
    heap_end: int | None = None
    max_error: float = 0.0  # greatest difference from eager over the checked calls

    @property
    def rss_growth(self) -> int:
        return self.rss_end - self.rss_warm

    @property
    def rss_growth_per_1000(self) -> float:
        return self.rss_growth * 1000 / self.calls

    @property
    def heap_growth(self) -> int | None:
        return None if self.heap_warm is None else self.heap_end - self.heap_warm

    def summary(self) -> str:
        mib = 1 << 20
        line = (f"{self.model} ({'kiln' if self.compiled else 'eager'}), {self.calls} calls in {self.seconds:.1f} s: "
                f"RSS {self.rss_warm / mib:.2f} MiB after warm-up, {self.rss_end / mib:.2f} MiB at the end, "
                f"growth {self.rss_growth / 1024:+.0f} KiB ({self.rss_growth_per_1000 / 1024:+.1f} KiB per 1,000 calls)")
        if self.heap_warm is not None:
            line += f"; Python heap growth {self.heap_growth / 1024:+.1f} KiB"
        return line + f"; max |kiln - eager| {self.max_error:.2e}"


def _settle() -> None:
    gc.collect()
    gc.collect()


def soak(model: str = "mlp", calls: int = 2000, batch_sizes: tuple[int, ...] = (8, 3, 16), compiled: bool = True,
         trace_heap: bool = False, every: int = 1000, check_every: int = 97, warmup: int = 500,
         seed: int = 0) -> SoakResult:
    """Call `MODELS[model]` compiled by kiln (default settings) `calls` times, cycling through
    `batch_sizes` with new random inputs each call; see the module docstring for what is measured."""
    torch.manual_seed(seed)
    eager = MODELS[model]().eval()
    run = kiln.compile(eager) if compiled else eager
    width = eager.up.in_features
    errors = [0.0]

    def step(n: int) -> None:
        x = torch.randn(batch_sizes[n % len(batch_sizes)], width)  # new values (and a new tensor) each call
        out = run(x)
        if n % check_every == 0:
            errors.append((out - eager(x)).abs().max().item())

    with torch.no_grad():
        # Warm-up: the loop itself, so every batch size is compiled, the eager check has run, and
        # the allocators' pools and torch's own caches are filled before the first reading.
        for n in range(warmup):
            step(n)
        _settle()
        if trace_heap:
            tracemalloc.start()
            heap_warm = tracemalloc.get_traced_memory()[0]
        rss_warm, samples = rss_bytes(), []
        start = time.perf_counter()
        for n in range(calls):
            step(n)
            if (n + 1) % every == 0:
                samples.append(rss_bytes())
        seconds = time.perf_counter() - start
        _settle()
        rss_end = rss_bytes()
        heap = (heap_warm, tracemalloc.get_traced_memory()[0]) if trace_heap else (None, None)
        if trace_heap:
            tracemalloc.stop()
    max_error = max(errors)
    return SoakResult(model, compiled, calls, seconds, rss_warm, rss_end, samples, *heap, max_error)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--models", default="mlp,break", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--batch-sizes", default="8,3,16", help="cycled through, one per call")
    parser.add_argument("--every", type=int, default=1000, help="sample resident memory every so many calls")
    parser.add_argument("--eager", action="store_true", help="run the loop without kiln (the noise floor)")
    parser.add_argument("--trace-heap", action="store_true", help="also measure the Python heap (slower)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.batch_sizes.split(","))
    results = []
    for model in args.models.split(","):
        result = soak(model, args.calls, sizes, compiled=not args.eager, trace_heap=args.trace_heap, every=args.every)
        print(result.summary())
        print("  RSS every %d calls (MiB): %s" % (args.every, " ".join(f"{s / (1 << 20):.2f}" for s in result.rss_samples)))
        results.append(result)
    if args.json:
        with open(args.json, "w") as out:
            json.dump([{**asdict(r), "rss_growth_per_1000": r.rss_growth_per_1000} for r in results], out, indent=1)


if __name__ == "__main__":
    main()
