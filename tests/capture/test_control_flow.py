"""torch.cond kept in the graph: both branches traced into graphs of their own, the graph calling
torch.ops.higher_order.cond on them; a branch that would change the world outside it is refused."""

import pytest
import torch

import kiln
from kiln.runtime import fallback
from tests.capture.test_graph_breaks import Counting
from tests.kiln_backend import private_cache  # noqa: F401  (each test compiles in an empty cache)


def _conds(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]


def test_a_tensor_predicate_keeps_both_branches_in_one_graph():
    backend = Counting()

    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos() * 2, (x,)) + 1

    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for x in (torch.rand(4), -torch.rand(4)):
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(backend.graphs) == 1 and len(_conds(backend.graphs[0])) == 1


def test_tensors_a_branch_reads_from_outside_become_operands_and_gradients_flow():
    linear = torch.nn.Linear(4, 4)
    scale = torch.randn(4)

    def fn(pred, x):
        def true_fn(t):
            return linear(t) * scale

        return torch.cond(pred, true_fn, lambda t: (t - scale).relu(), [x])

    x = torch.randn(3, 4, requires_grad=True)
    compiled = kiln.compile(fn)  # kiln's backend: the graph runs through ATen, recorded
    fallback.reset()
    for pred in (torch.tensor(True), torch.tensor(False)):
        got, want = compiled(pred, x), fn(pred, x)
        torch.testing.assert_close(got, want)
        (g,) = torch.autograd.grad(got.sum(), x)
        (w,) = torch.autograd.grad(want.sum(), x)
        torch.testing.assert_close(g, w)
    assert any(f.graph == "graph with higher-order ops" for f in fallback.FALLBACKS)


def test_a_predicate_known_while_capturing_runs_its_branch_inline():
    backend = Counting()
    compiled = kiln.compile(lambda x, flag: torch.cond(flag, torch.sin, torch.cos, (x,)), backend=backend, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, True), x.sin())
    torch.testing.assert_close(compiled(x, False), x.cos())
    assert not any(_conds(gm) for gm in backend.graphs)


def test_nested_conds_and_tuple_results():
    def fn(p, q, x):
        def inner(t):
            return torch.cond(q, lambda u: (u * 10, u + 0), lambda u: (u * -1, u + 1), (t,))

        def outer_true(t):
            a, b = inner(t)
            return a + b, b

        return torch.cond(p, outer_true, lambda t: (t.sin(), t.cos()), (x,))

    backend = Counting()
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    x = torch.randn(2)
    for p in (True, False):
        for q in (True, False):
            got, want = compiled(torch.tensor(p), torch.tensor(q), x), fn(torch.tensor(p), torch.tensor(q), x)
            assert isinstance(got, tuple) and len(got) == 2
            torch.testing.assert_close(got, want)
    assert len(backend.graphs) == 1


def test_a_branch_may_change_what_it_makes_but_not_what_outside_holds():
    seen = []

    def local_changes(x):
        def branch(t):
            parts = []
            parts.append(t * 2)
            return parts[0]

        return torch.cond(x.sum() > 0, branch, lambda t: t + 0, (x,))

    x = torch.rand(3)
    torch.testing.assert_close(kiln.compile(local_changes, backend="eager", fullgraph=True)(x), x * 2)

    def outside_change(x):
        def branch(t):
            seen.append(1)
            return t * 2

        return torch.cond(x.sum() > 0, branch, lambda t: t + 0, (x,))

    with pytest.raises(kiln.CaptureError, match="inside a branch of torch.cond"):
        kiln.compile(outside_change, backend="eager", fullgraph=True)(x)
    assert seen == []


def test_a_branch_returning_its_input_as_it_is_is_refused_as_torch_cond_refuses_it():
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t, lambda t: t + 1, (x,))

    with pytest.raises(kiln.CaptureError, match="returning one of its inputs"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.rand(3))
