"""Shared by the backend's tests: compile a function through kiln's AOT layer and C++ backend and
keep the CompiledGraph, with a private compile cache per test."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import kiln
from kiln import aot
from kiln.autotune import attention, gemm
from kiln.backend import Backend, watch
from kiln.runtime import fallback


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    """Import into a test module to give each of its tests an empty compile cache."""
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield tmp_path / "cache"


def compiled(fn, *inputs, freezing=False, autotune="off"):
    """(outputs, CompiledGraph of the first graph) of `fn` (a function or module) compiled by kiln.

    Freezing is off unless asked for, so a test of one backend feature sees the module's
    parameters as graph inputs; with `freezing=True` the program is a FrozenProgram whose
    `runtime` is the CompiledGraph."""
    programs = []

    def compile_graph(gm, example_inputs):
        programs.append(Backend()(gm, example_inputs))
        return programs[-1]

    with torch.no_grad(), kiln.config.patch({"backend.freezing": freezing, "backend.autotune": autotune}):
        out = aot.compile(fx.symbolic_trace(fn), list(inputs), compile_graph)(*inputs)
    return out, programs[0]


@pytest.fixture
def kiln_wherever_offered(monkeypatch):
    """The autotuner's answer made kiln's own implementation wherever it is a candidate: a test of
    kiln's kernels in a model, not of which implementation this machine's timing would pick."""
    pick = gemm.choose
    for module in (gemm, attention):
        monkeypatch.setattr(module, "choose", lambda op, signature, candidates, *a, **k: "kiln" if "kiln" in candidates
                            else pick(op, signature, candidates, *a, **k))


def compiled_graphs(model, *inputs, cpp_wrapper: bool = True, tolerance: float = 1e-4) -> list:
    """The graphs `kiln.compile(model)` builds for `inputs`, after checking its result against
    eager's, that nothing fell back to eager, and that each graph has the wrapper asked for."""
    kiln.reset()
    fallback.reset()
    with torch.no_grad(), kiln.config.patch({"backend.cpp_wrapper": cpp_wrapper}), watch() as built:
        torch.testing.assert_close(kiln.compile(model)(*inputs), model(*inputs), rtol=tolerance, atol=tolerance)
    assert not fallback.FALLBACKS
    graphs = [getattr(b, "runtime", b) for b in built]
    assert all((g.artifact.cpp_wrapper is not None) == cpp_wrapper for g in graphs)
    return graphs


def rewritten_until(last: str, model, x, codegen: str = "triton", settings: dict | None = None):
    """(`model`'s ATen graph after the backend's rewrites up to `last`, for a GPU's Triton
    (codegen "triton": a CUDA target over CPU tensors, which ATen runs the same) or the CPU's C++;
    its output on x)."""
    from kiln.backend.codegens import CODEGENS
    from kiln.ir.target import Target
    from kiln.lowering.registry import LOWERINGS
    from kiln.passes import pipeline

    target = Target("cuda" if codegen == "triton" else "cpu", CODEGENS[codegen].traits, frozenset(LOWERINGS))
    graphs = []

    def compile_graph(gm, example_inputs):
        for name, rewrite in pipeline.REWRITES:
            if rewrite(gm, target):
                gm.recompile()
            if name == last:
                break
        graphs.append(gm)
        return gm

    with torch.no_grad(), kiln.config.patch(settings or {}):
        out = aot.compile(fx.symbolic_trace(model), [x], compile_graph)(x)
    return graphs[0], out
