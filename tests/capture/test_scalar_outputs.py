"""Numbers read from tensor data kept in the graph (kiln/capture/variables/unbacked.py): with the
setting capture.scalar_outputs, or under fullgraph=True, `t.item()`, `t.tolist()`, `int(t)` ... are
graph nodes whose values are unbacked symbols; one graph serves every value, `torch._check` on them
is checked when the graph runs, a branch on them is still a graph break; kiln's own backend
compiles the graph for each value read from an input, and runs it through ATen, recorded, where
the number comes from a tensor it computes."""

import pytest
import torch

import kiln
from kiln.capture.break_records import CaptureError
from kiln.runtime import fallback
from tests.capture.test_graph_breaks import Counting


def _compiled(fn, fullgraph=False):
    kiln.reset()
    backend = Counting()
    return kiln.compile(fn, backend=backend, fullgraph=fullgraph), backend


def _reads_data(gm) -> bool:
    return any(n.op == "call_method" and n.target == "item" for n in gm.graph.nodes)


def test_item_is_a_node_and_one_graph_serves_every_value():
    def fn(x, y):
        return y * x.item() + torch.arange(x.int().item()).sum()

    with kiln.config.patch({"capture.scalar_outputs": True}):
        compiled, backend = _compiled(fn)
        for value in (3.0, 5.0, 0.0):
            x, y = torch.tensor([value]), torch.randn(4)
            torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert len(backend.graphs) == 1 and _reads_data(backend.graphs[0])  # compiled once, for every value


def test_without_the_setting_item_breaks_the_graph():
    def fn(x, y):
        return y * x.item()

    compiled, backend = _compiled(fn)
    x, y = torch.tensor([2.0]), torch.randn(3)
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert not any(_reads_data(gm) for gm in backend.graphs)


def test_fullgraph_keeps_item_in_the_graph_as_dynamo_does():
    def fn(x, y):
        return y[: x.item()] * 2, x.item() + 1  # a data-dependent size, and the number itself returned

    compiled, backend = _compiled(fn, fullgraph=True)
    for n in (2, 4):
        x, y = torch.tensor(n), torch.randn(6)
        got, want = compiled(x, y), fn(x, y)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and type(got[1]) is int
    assert len(backend.graphs) == 1


def test_torch_check_on_a_read_number_is_checked_when_the_graph_runs():
    def fn(x):
        n = x.item()
        torch._check(n >= 0)
        if n >= 0:  # (decided by the check: no branch on data)
            return x * 2
        return x * 3

    for backend in ("eager", "kiln"):
        kiln.reset()
        compiled = kiln.compile(fn, backend=backend, fullgraph=True)
        torch.testing.assert_close(compiled(torch.tensor([3])), torch.tensor([6]))
        with pytest.raises(RuntimeError, match="Expected cond to be True"):  # eager's torch._check raises so
            compiled(torch.tensor([-2]))


def test_a_branch_on_a_read_number_is_a_graph_break():
    def fn(x, y):
        if x.item() > 2:
            return y + 1
        return y - 1

    with kiln.config.patch({"capture.scalar_outputs": True}):
        compiled, backend = _compiled(fn)
        for value in (1, 5):
            x, y = torch.tensor([value]), torch.randn(3)
            torch.testing.assert_close(compiled(x, y), fn(x, y))
        with pytest.raises(CaptureError, match="read from tensor data"):
            _compiled(fn, fullgraph=True)[0](torch.tensor([1]), torch.randn(3))


def test_tolist_conversions_and_a_read_index():
    def fn(x, i, f):
        a, b = x.tolist()
        return [v * 2 for v in x.tolist()], a + b, int(f), float(i), bool(i), x[i.item()] * 1

    compiled, backend = _compiled(fn, fullgraph=True)
    for values, index in (([4, 7], 1), ([1, 2], 0)):
        args = torch.tensor(values), torch.tensor(index), torch.tensor(2.7)
        got, want = compiled(*args), fn(*args)
        assert got[:5] == want[:5] and [type(v) for v in got[:5]] == [type(v) for v in want[:5]]
        torch.testing.assert_close(got[5], want[5])
    assert len(backend.graphs) == 1


def test_a_dynamic_size_is_specialized_by_tolist():
    def fn(x):
        return sum(x.tolist()) + x.size(0)

    kiln.reset()
    compiled = kiln.compile(fn, backend="eager", fullgraph=True, dynamic=True)
    assert compiled(torch.tensor([1, 2])) == 5
    assert compiled(torch.tensor([1, 2, 3])) == 9  # another length: guarded, compiled again


def test_kilns_backend_specializes_on_an_inputs_value_and_runs_a_computed_ones_through_aten():
    def of_input(x, y):
        return torch.relu(y) * x.item()

    def of_computed(x, y):
        n = (x.sum() * 2).int().item()
        return torch.relu(y) * n + torch.arange(n).sum()

    fallback.reset()
    for fn in (of_input, of_computed):
        kiln.reset()
        compiled = kiln.compile(fn, fullgraph=True)
        for value in ([1.0, 2.0], [3.0, 1.0], [1.0, 2.0]):
            x, y = torch.tensor(value[:1] if fn is of_input else value), torch.randn(8)
            torch.testing.assert_close(compiled(x, y), fn(x, y))
    # An input's value: compiled for each value read (as kiln does for ATen's own reads, narrow's
    # tensor start); a computed tensor's: through ATen, recorded.
    assert [f.graph for f in fallback.FALLBACKS] == ["graph reading numbers from computed tensors"]
    assert "tensor.item()" in fallback.FALLBACKS[0].reason


def test_item_of_several_elements_raises_eagers_error():
    def fn(x):
        return x.item()

    with pytest.raises(RuntimeError, match="cannot be converted to Scalar|only one element"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.ones(2))
