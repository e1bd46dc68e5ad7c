"""Small tensors made from constants have known values while capturing (kiln/capture/known_values.py):
reading their data — a slice bound, `int(t)`, an `if` — is a constant, not a graph break, and a
write that capture does not follow makes the value unknown again. Each test compares with eager and
counts the graphs."""

import itertools

import pytest
import torch

import kiln
from tests.capture.test_graph_breaks import Counting


def _run(fn, *args, fullgraph=False):
    kiln.reset()
    backend = Counting()
    got = kiln.compile(fn, backend=backend, fullgraph=fullgraph)(*args)
    torch.testing.assert_close(got, fn(*args))
    return backend.graphs


def _reads_data(gm) -> bool:
    """Whether the graph reads a number from tensor data when it runs (tensor.item() kept in it)."""
    return any(n.op == "call_method" and n.target == "item" for n in gm.graph.nodes)


def test_debertas_span_bounds_a_slice_without_a_break():
    def relative_bias(table, q):  # transformers' DeBERTa, disentangled_att_bias
        span = torch.tensor(min(max(q.size(-2), q.size(-2)), 512))
        rel = table[512 - span: 512 + span, :].unsqueeze(0)
        return q @ rel.transpose(-1, -2), torch.clamp(span * 2 - 1, 0, 1000)

    graphs = _run(relative_bias, torch.randn(1024, 16), torch.randn(2, 100, 16), fullgraph=True)
    assert len(graphs) == 1
    assert any(n.target is torch.tensor for n in graphs[0].graph.nodes)  # still a tensor in the graph too


def test_known_values_decide_branches_and_python_numbers():
    def fn(x):
        bounds = torch.arange(4) * 2  # [0, 2, 4, 6]
        if bounds[1] > 1:
            x = x * float(bounds[3].item())
        return x[bounds[1]: int(bounds[2])] + bounds.sum()

    assert len(_run(fn, torch.randn(8), fullgraph=True)) == 1


@pytest.mark.parametrize("write", ["in place", "through a view", "setitem", "out"])
def test_a_write_capture_does_not_follow_makes_the_value_unknown(write):
    def fn(x):
        t = torch.tensor([3])
        if write == "in place":
            t.add_(x.sum().long())
        elif write == "through a view":
            t.view(()).mul_(x.sum().long())
        elif write == "setitem":
            t[0] = x.sum().long()
        else:
            torch.add(t, x.sum().long(), out=t)
        return x[: int(t)]

    x = torch.ones(8)  # t becomes 11, 8, 8 and 11: eager takes x[:11] or x[:8]
    # Under fullgraph the read stays in the graph, a number read when it runs (never the value
    # before the write); without, it is a graph break. Eager's result both ways.
    graphs = _run(fn, x, fullgraph=True)
    assert len(graphs) == 1 and _reads_data(graphs[0])
    assert len(_run(fn, x)) >= 1


def test_random_tensors_are_never_known():
    def fn(x):
        k = torch.randint(1, 4, ())
        return x[: int(k)].sum() * 0 + k

    kiln.reset()
    backend = Counting()
    k = kiln.compile(fn, backend=backend, fullgraph=True)(torch.ones(8))
    assert len(backend.graphs) == 1 and _reads_data(backend.graphs[0])  # k read when the graph runs
    assert 1 <= int(k) <= 3


def test_large_tensors_are_not_computed_at_capture():
    def fn(x):
        big = torch.ones(100)
        return x[: int(big.sum())]

    graphs = _run(fn, torch.ones(200), fullgraph=True)
    assert len(graphs) == 1 and _reads_data(graphs[0])


def test_numpy_scalars_reach_ops_as_python_numbers():
    # An np.int64 / np.float32 argument of a torch op is the number it stands for (torch gives the
    # same result dtype): one graph, not a break at "a constant the graph cannot hold" (found by
    # Dynamo's test_numpy_int_constant).
    import numpy as np

    def fn(x, a, b, c):
        return x + (a % b), x * c, torch.full((2,), b)

    seen = []
    compiled = kiln.compile(fn, backend=lambda gm, ex: (seen.append(gm), gm.forward)[1], fullgraph=True)
    args = (torch.randn(10), 4096, np.int64(8), np.float32(0.5))
    for got, want in zip(compiled(*args), fn(*args)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    assert len(seen) == 1


def test_a_torch_function_is_true_and_itertools_repeat_counts():
    # `if self.act:` on F.relu (Dynamo's test_fnmember) and torch's `_pair(x)`, which builds
    # `tuple(itertools.repeat(x, 2))` (test_pair): both one graph.
    from torch.nn.modules.utils import _pair

    def fn(x, act):
        if act:
            x = act(x)
        size = _pair(x.shape[0])
        return x.reshape(size[0], -1) + len(list(itertools.repeat(1, 3)))

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, torch.nn.functional.relu), fn(x, torch.nn.functional.relu))
