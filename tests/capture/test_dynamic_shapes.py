"""Dynamic shapes: a recompile caused only by changed sizes makes those dimensions symbolic, so
later sizes reuse one capture; the relations the trace relied on are guarded."""

import logging
import os

import pytest
import torch

import kiln
from kiln.runtime import fallback
from tests.capture.test_graph_breaks import Counting
from tests.kiln_backend import private_cache  # noqa: F401  (each test compiles in an empty cache: they count builds)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def reshape_and_slice(x, w):
    b, s = x.shape
    y = x.view(b, s // 2, 2) * 2
    z = y.sum(-1) @ w[: s // 2]
    return z.relu() + torch.arange(b).unsqueeze(-1)


SHAPES = [(1, 16), (2, 32), (3, 64), (4, 16), (2, 128), (1, 32), (3, 48), (4, 96)]


def _run(compiled, fn, shapes, *rest):
    for b, s in shapes:
        x = torch.randn(b, s)
        torch.testing.assert_close(compiled(x, *rest), fn(x, *rest))


def test_automatic_dynamic_after_a_size_change():
    kiln.reset()
    backend = Counting()
    compiled = kiln.compile(reshape_and_slice, backend=backend)
    _run(compiled, reshape_and_slice, SHAPES, torch.randn(64, 8))
    # static (1, 16); dynamic for batch >= 2; dynamic with batch 1 specialized (sizes 0 and 1 are)
    assert len(compiled.kiln_cache.entries) == 3 and len(backend.graphs) == 3
    dynamic = compiled.kiln_cache.entries[1]
    shapes = [g.describe() for g in dynamic.guards.guards if g.kind == "SHAPE"]
    assert "SHAPE              2 <= L['x'].size()[0]" in shapes
    assert any("<= 129" in g for g in shapes)  # w[: s // 2] needs s // 2 <= 64
    placeholder = next(n for n in backend.graphs[1].graph.nodes if n.op == "placeholder")
    assert all(isinstance(d, torch.SymInt) for d in placeholder.meta["example_value"].shape)


def test_a_size_past_what_the_trace_relied_on_recompiles():
    kiln.reset()
    compiled = kiln.compile(reshape_and_slice, backend=Counting())
    w = torch.randn(64, 8)
    _run(compiled, reshape_and_slice, [(2, 16), (2, 32)], w)
    assert len(compiled.kiln_cache.entries) == 2
    with pytest.raises(RuntimeError):  # eager raises too: w has 64 rows, the slice needs 70
        reshape_and_slice(torch.randn(2, 140), w)
    with pytest.raises(RuntimeError):
        compiled(torch.randn(2, 140), w)


def test_dynamic_true_makes_every_size_symbolic_from_the_start():
    kiln.reset()
    compiled = kiln.compile(reshape_and_slice, backend=Counting(), dynamic=True)
    _run(compiled, reshape_and_slice, [s for s in SHAPES if s[0] > 1], torch.randn(64, 8))
    assert len(compiled.kiln_cache.entries) == 1


def test_dynamic_false_specializes_every_size():
    kiln.reset()
    compiled = kiln.compile(reshape_and_slice, backend=Counting(), dynamic=False)
    _run(compiled, reshape_and_slice, SHAPES[:4], torch.randn(64, 8))
    assert len(compiled.kiln_cache.entries) == 4
    assert not any(g.kind == "SHAPE" for e in compiled.kiln_cache.entries for g in e.guards.guards)


def test_mark_dynamic():
    def f(x):
        return x.softmax(-1) * x.shape[0]

    kiln.reset()
    compiled = kiln.compile(f, backend=Counting())
    for b in (3, 5, 9):
        x = torch.randn(b, 4)
        kiln.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(compiled.kiln_cache.entries) == 1
    with pytest.raises(ValueError, match="dim must be"):
        kiln.mark_dynamic(torch.randn(2, 2), 2)
    with pytest.raises(TypeError, match="tensor must be"):
        kiln.mark_dynamic([1, 2], 0)


def test_relations_between_inputs_are_guarded():
    def f(x, y):
        return (x + y).sum(0)

    kiln.reset()
    compiled = kiln.compile(f, backend=Counting())
    for n in (3, 4, 5):
        x, y = torch.randn(n, 2), torch.randn(n, 2)
        torch.testing.assert_close(compiled(x, y), f(x, y))
    assert len(compiled.kiln_cache.entries) == 2
    # broadcasting a size-1 row is another relation: a new entry, same result as eager
    x, y = torch.randn(6, 2), torch.randn(1, 2)
    torch.testing.assert_close(compiled(x, y), f(x, y))
    assert len(compiled.kiln_cache.entries) == 3


def test_python_branching_on_a_size_specializes_that_decision():
    def f(x):
        if x.shape[0] > 4:
            return x * 2
        return x - 1

    kiln.reset()
    compiled = kiln.compile(f, backend=Counting())
    for n in (2, 3, 4, 6, 7, 8):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), f(x))
    # static 2; dynamic n <= 4; dynamic n > 4
    assert len(compiled.kiln_cache.entries) == 3


def test_the_kiln_backend_compiles_a_graph_with_symbolic_sizes_once():
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(reshape_and_slice)
    with kiln.backend.watch() as built:
        _run(compiled, reshape_and_slice, [(2, 16), (3, 32), (4, 48), (5, 64)], torch.randn(64, 8))
    assert len(compiled.kiln_cache.entries) == 2
    # The static first capture (it may come from the AOT graph cache), then one graph for every
    # later size: its kernels take the sizes as arguments.
    symbolic = [b for b in built if any(b.stages.kernels.size_arguments.values())]
    assert len(symbolic) == 1 and built[-1] is symbolic[0] and not fallback.FALLBACKS


def test_with_symbolic_kernels_off_the_backend_specializes_per_size_and_says_so(caplog):
    kiln.reset()
    compiled = kiln.compile(reshape_and_slice)
    with kiln.config.patch({"debug.logs": "recompiles", "backend.symbolic_kernels": False}), caplog.at_level(logging.INFO):
        _run(compiled, reshape_and_slice, [(2, 16), (3, 32), (4, 48)], torch.randn(64, 8))
    assert len(compiled.kiln_cache.entries) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert any("compiled per size: backend.symbolic_kernels (KILN_SYMBOLIC_KERNELS) is off" in m for m in messages)
    specialized = [m for m in messages if "specialized to" in m]
    assert len(specialized) == 2 and "(3, 32)" in specialized[0]


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_hf_models_over_many_shapes_recompile_at_most_twice(name):
    # The hf suite's models (full size, random weights): 13 batch x sequence shapes, 1-4 x 16-128.
    from benchmarks.models import MODELS

    model = MODELS[name].build(False)
    kiln.reset()
    backend = Counting()
    compiled = kiln.compile(model, backend=backend)
    shapes = [(1, 16), (2, 32), (3, 64), (4, 128), (1, 48), (2, 128), (4, 16), (3, 100), (1, 128), (2, 77), (4, 64), (3, 16), (2, 16)]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for b, s in shapes:
            ids = torch.randint(0, 1000, (b, s), generator=g)
            torch.testing.assert_close(compiled(input_ids=ids)[0], model(input_ids=ids)[0], rtol=1e-4, atol=1e-4)
    cache = compiled.kiln_cache
    assert len(backend.graphs) == len(cache.entries) <= 3 and cache.eager_calls == 0 and cache.fallback is None


@pytest.mark.parametrize("name, fn, shape", [
    ("trace", lambda x: torch.trace(x), (5, 5)), ("narrow_copy", lambda x: x.narrow_copy(1, 1, 2), (5, 5)),
    ("addbmm", lambda x: torch.addbmm(x[0], x, x), (3, 3, 3)), ("diagonal_copy", lambda x: torch.diagonal_copy(x), (5, 5))])
def test_ops_whose_cpp_meta_wants_numbers_capture_with_symbolic_sizes(name, fn, shape):
    # Their Python decompositions (torch's Python dispatcher) give the result's symbolic shape.
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for grow in (0, 2):
        x = torch.randn(*(s + grow for s in shape))
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(compiled.kiln_cache.entries) == 1 and compiled.kiln_cache.entries[0].graph_break is None
    assert not fallback.FALLBACKS


def _sizes_alive_at_a_break(x):
    n = x.shape[1]
    m = (n * 3 + 1) // 2
    y = x.sin()
    print("a graph break with n and m alive")
    return y[:, : n - 1] * m


def test_symbolic_sizes_alive_at_a_graph_break_resume(capsys):
    """A size alive at a break is computed again from the inputs' sizes by the runner (the graph
    returns tensors only); before, the frame fell back to eager at the first dynamic recompile."""
    kiln.reset()
    backend = Counting()
    compiled = kiln.compile(_sizes_alive_at_a_break, backend=backend)
    for width in (6, 8, 11, 20):
        x = torch.randn(2, width)
        torch.testing.assert_close(compiled(x), _sizes_alive_at_a_break(x))
    breaks = kiln.capture.BREAKS
    assert breaks and all(record.resumed for record in breaks), breaks
    assert compiled.kiln_cache.fallback is None
    # static, then dynamic: later widths reuse the dynamic entry and its runner computes m again
    assert len(compiled.kiln_cache.entries) == 2
    assert "size(1)" in compiled.kiln_cache.entries[1].runner_source


def test_a_size_read_from_data_at_a_break_still_runs_eagerly():
    kiln.reset()

    def f(x):
        k = int(torch.count_nonzero(x > 0))  # a number read from data: no input size gives it
        y = x[:k].cos()
        print("break")
        return y * k

    compiled = kiln.compile(f)
    for n in (5, 7, 9):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), f(x))


def test_a_symbolic_size_compared_with_a_tuple_is_guarded():
    def fn(x):
        if x.size() != (5, 1, 2, 3):
            return x.cos()
        return x.sin()

    compiled = kiln.compile(fn, backend="eager", dynamic=True)
    for shape in ((5, 1, 3, 4), (5, 1, 2, 3), (5, 1, 3, 4)):
        x = torch.rand(shape)
        torch.testing.assert_close(compiled(x), fn(x))  # (the second took the first's graph: a wrong value)


def test_size_with_dim_by_name_and_out_of_range():
    x = torch.empty(4, 9, 8)
    compiled = kiln.compile(lambda x, dim: x.size(dim=dim), backend="eager", fullgraph=True)
    assert compiled(x, 1) == 9 and compiled(x, -2) == 9
    with pytest.raises(IndexError):
        compiled(x, 3)
