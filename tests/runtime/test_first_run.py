"""A Triton graph whose kernel fails at its first call (on a GPU, Triton compiles each kernel at its
first launch, after kiln's compile returned): the call's result comes from ATen's graph, the
fallback is recorded, the graph is never stored in the AOT graph cache as good, and one loaded from
the cache that fails here is dropped from it. Forced failures, under Triton's interpreter, through
every mode: default, reduce-overhead (CUDA graphs, declined on CPU: the same first call under
them), training."""

import importlib
from pathlib import Path

import pytest
import torch

import kiln
from kiln import config
from kiln.codegen.triton import printer
from kiln.runtime import compiled_graph, fallback

aot_compile = importlib.import_module("kiln.aot.compile")  # (the package exports its function `compile`)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.sin(self.linear(x)) * 2


@pytest.fixture
def cache(tmp_path):
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache"), "backend.codegen": "triton",
                            "backend.autotune": "off"}):
        kiln.reset()
        fallback.reset()
        yield tmp_path / "cache"
    kiln.reset()


@pytest.fixture
def sin_rejected(monkeypatch):
    """Kernels computing a sine call a helper no kernel module defines: each fails where it first
    runs, as a kernel Triton rejects on a GPU."""
    monkeypatch.setitem(printer.UNARY, "sin", "kiln_not_defined_anywhere({0})")


def aot_entries(cache: Path) -> list[Path]:
    return sorted((cache / "aot").rglob("*.pkl")) if (cache / "aot").exists() else []


def first_call_fallbacks() -> list[str]:
    return [f.graph for f in fallback.FALLBACKS if "first call" in f.graph]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_graph_failing_at_its_first_call_runs_through_aten_and_is_not_cached(cache, sin_rejected, mode):
    model, x = Model().eval(), torch.randn(4, 8)
    compiled = kiln.compile(model, mode=mode)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x))
    assert first_call_fallbacks() == ["a Triton graph at its first call"]  # once, not per call
    assert aot_entries(cache) == []


def test_a_training_graph_failing_at_its_first_call_runs_through_aten(cache, sin_rejected):
    model, x = Model(), torch.randn(4, 8)
    twin = Model()
    twin.load_state_dict(model.state_dict())
    kiln.compile(model)(x).sum().backward()
    twin(x).sum().backward()
    torch.testing.assert_close(model.linear.weight.grad, twin.linear.weight.grad)
    assert len(first_call_fallbacks()) >= 1  # the forward graph (sine) and the backward (its cosine)
    assert aot_entries(cache) == []


def test_a_graph_is_stored_after_its_first_call_completed(cache, monkeypatch):
    model, x = Model().eval(), torch.randn(4, 8)
    stored_when_called = []
    call = compiled_graph.CompiledGraph.__call__

    def called(self, *args):
        stored_when_called.append(len(aot_entries(cache)))
        return call(self, *args)

    monkeypatch.setattr(compiled_graph.CompiledGraph, "__call__", called)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))
    assert stored_when_called == [0] and len(aot_entries(cache)) == 1
    assert not fallback.FALLBACKS


def test_a_loaded_graph_failing_here_runs_through_aten_and_is_dropped(cache, monkeypatch):
    model, x = Model().eval(), torch.randn(4, 8)
    with torch.no_grad():
        kiln.compile(model)(x)
    (entry,) = aot_entries(cache)

    class CompilationError(Exception):
        __module__ = "triton.compiler.errors"

    load = compiled_graph.load_module

    def rejecting(source, device, interpret=None):  # the stored kernels, rejected on this GPU
        module = load(source, device, interpret)
        for name in dir(module):
            if name.startswith("kernel_"):
                setattr(module, name, lambda *a: (_ for _ in ()).throw(CompilationError("at 3:4: rejected here")))
        return module

    monkeypatch.setattr(compiled_graph, "load_module", rejecting)
    kiln.reset()
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))
    assert [f.reason for f in fallback.FALLBACKS] == ["CompilationError: at 3:4: rejected here"]
    assert not entry.exists() and aot_entries(cache) == []


def test_settings_that_change_the_compiled_graph_are_in_the_cache_key(cache):
    fields = set(config.backend._specs)
    assert set(aot_compile.KEYED_SETTINGS) | set(aot_compile.UNKEYED_SETTINGS) == fields
    assert not set(aot_compile.KEYED_SETTINGS) & set(aot_compile.UNKEYED_SETTINGS)
    model, x = Model().eval(), torch.randn(4, 8)
    with torch.no_grad():
        kiln.compile(model)(x)
        kiln.reset()
        kiln.compile(model, mode="reduce-overhead")(x)  # another entry, not the default mode's
    assert len(aot_entries(cache)) == 2


class Gather(torch.nn.Module):
    def forward(self, x, ids):
        return torch.sin(x)[ids] * 2


def test_an_index_out_of_range_at_the_first_call_is_the_inputs_fault(cache, monkeypatch):
    """kiln's index check raising at a graph's first call is the user's error, raised as it is: ATen's
    graph is not tried on those inputs (on a GPU its indexing kernel asserts on the device, and the
    process's CUDA context is lost: found on an H200), no fallback is recorded, and the graph's next
    calls run kiln's kernels."""
    tried_aten, graphs = [], set()
    fall_back, call = compiled_graph.CompiledGraph._fall_back, compiled_graph.CompiledGraph.__call__
    monkeypatch.setattr(compiled_graph.CompiledGraph, "_fall_back",
                        lambda self, *a: tried_aten.append(a) or fall_back(self, *a))
    monkeypatch.setattr(compiled_graph.CompiledGraph, "__call__", lambda self, *a: graphs.add(self) or call(self, *a))
    model, x = Gather(), torch.randn(6, 3)
    compiled = kiln.compile(model)
    with torch.no_grad(), pytest.raises(IndexError, match="index out of range in kiln kernel"):
        compiled(x, torch.tensor([0, 9]))
    assert tried_aten == [] and fallback.FALLBACKS == []
    ids = torch.tensor([5, 0])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, ids), model(x, ids))
    (graph,) = graphs
    assert graph.first_run is True and graph.call is graph._loaded_call  # kiln's kernels, not ATen's graph
