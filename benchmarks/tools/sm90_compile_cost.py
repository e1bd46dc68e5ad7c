"""What a GPU graph's Triton kernels cost to compile, measured on a machine without a GPU.

Each model (kiln bench's registry; the gpu suite's by default) is compiled in bfloat16 as kiln
compiles it for a GPU — Triton kernels, block sizes autotuned (`backend.autotune`'s default),
products timed against the library's — but on CPU tensors; its Triton module is taken when it
loads (the graph then runs eagerly, recorded as a fallback) and compiled for an H100 (sm_90) by
the stand-in CUDA driver (benchmarks/standin_driver.py), with `--workers` worker processes, as
`precompile` does when a GPU graph loads (kiln/runtime/triton_kernels.py).

    PYTHONPATH=. python benchmarks/tools/sm90_compile_cost.py [--models bert,gpt2] [--workers 2] [--batch 8]

Per graph of each model: its module's launchers and jit functions (the graph's kernels that print
one text share one) and the seconds their warm-ups took to compile. What differs from a
GPU: the CPU target's decisions before the printer (freezing, which makes a CPU graph's products
prepacked GEMMs, is off here; convolutions keep the CPU's layout rules), and the host: a loaded
16-core GPU host compiled slower than an idle 2-core VM (issue 50's checks).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch

import kiln
import kiln.backend.codegens as codegens
import kiln.runtime.compiled_graph as compiled_graph
from benchmarks.standin_driver import standin_cuda
from kiln.runtime import triton_kernels


@dataclass
class CompileCost:
    launchers: int  # in the module: the graph's kernels that print one text share one
    jit_functions: int
    seconds: float  # the module's warm-ups compiled for sm_90


class _Taken(Exception):
    """Raised where the graph would load its module: the graph runs eagerly."""


@contextlib.contextmanager
def _as_for_a_gpu(sources: list[str]) -> Iterator[None]:
    """kiln's choices for a GPU graph's kernels on a CPU one, and its module taken at load."""
    tuning, load = codegens.triton_tuning, compiled_graph.load_module

    def take(source: str, *args: Any, **kwargs: Any) -> None:
        sources.append(source)
        raise _Taken()

    # (kiln's rule for a GPU target: the setting, none with autotuning off)
    codegens.triton_tuning = lambda target: None if kiln.config.backend.autotune == "off" else kiln.config.backend.autotune
    compiled_graph.load_module = take
    try:
        with kiln.config.patch({"backend.codegen": "triton", "backend.triton_gemm": "timed", "backend.freezing": False}):
            yield
    finally:
        codegens.triton_tuning, compiled_graph.load_module = tuning, load


def module_sources(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> list[str]:
    """The Triton modules kiln prints for `model`'s graphs as for a GPU."""
    sources: list[str] = []
    with torch.no_grad(), _as_for_a_gpu(sources), warnings.catch_warnings():
        # (each graph taken at its load runs eagerly, as kiln then warns: here on purpose)
        warnings.filterwarnings("ignore", message=r"kiln: graph .* runs eagerly: _Taken", category=RuntimeWarning)
        kiln.compile(model)(**inputs)
    return sources


def compile_cost(source: str, workers: int) -> CompileCost:
    """`source`'s warm-ups compiled for sm_90 by `workers` processes, into a fresh Triton cache."""
    before = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache, standin_cuda():
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            module = triton_kernels.load_module(source, "cpu", interpret=False)
            started = time.perf_counter()
            triton_kernels.precompile(module, workers)
            seconds = time.perf_counter() - started
        finally:
            if before is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = before
    jit = sum(1 for line in source.splitlines() if line.startswith("def triton_"))
    return CompileCost(len(module.KILN_PRECOMPILE), jit, seconds)


def main() -> None:
    from benchmarks.models import MODELS, chosen_models
    from benchmarks.worker import batched

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated (default: the gpu suite's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    names = chosen_models(None if args.models else "gpu", args.models or "")
    print(f"{'model':<10} {'graph':>5} {'launchers':>9} {'jit functions':>13} {'sm_90 compile s':>15}")
    for name in names:
        spec = MODELS[name]
        model = spec.build(False).to(torch.bfloat16)
        inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                  for k, v in batched(spec.make_inputs(), args.batch).items()}
        for number, source in enumerate(module_sources(model, inputs)):
            cost = compile_cost(source, args.workers)
            print(f"{name:<10} {number:>5} {cost.launchers:>9} {cost.jit_functions:>13} {cost.seconds:>15.1f}")


if __name__ == "__main__":
    main()
