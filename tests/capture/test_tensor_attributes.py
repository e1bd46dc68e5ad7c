"""Attributes of tensors inside captured code: what the class has but kiln does not model breaks
the graph; an input's own attributes (`x.test = ...`) are read and their presence guarded."""

import pytest
import torch

import kiln
from tests.capture.util import assert_same, check


def test_tensor_attributes_kiln_does_not_model_break_rather_than_raise():
    def leaf_grad_fn(x, w):
        return x + 1, x.grad_fn, w.grad_fn, hasattr(x, "no_such_attribute")

    w = torch.nn.Parameter(torch.ones(2))
    check(leaf_grad_fn, torch.randn(2), w)

    def version(x):
        y = x * 2
        return y + y._version

    compiled = kiln.compile(version, backend="eager")
    x = torch.randn(2)
    assert_same(compiled(x), version(x))
    assert compiled.kiln_cache.fallback is None
    with pytest.raises(kiln.CaptureError, match="tensor._version"):
        kiln.compile(version, backend="eager", fullgraph=True)(x)


def test_an_inputs_own_attribute_is_read_and_its_presence_guarded():
    # Dynamo's test_misc.py test_tensor_hasattr: kiln answered hasattr(x, "test") False for an
    # input that had it (a wrong result).
    def fn(x):
        if hasattr(x, "test"):
            return x * x.test
        return x + 1

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    plain, tagged = torch.ones(2), torch.ones(2)
    tagged.test = 3.0
    torch.testing.assert_close(compiled(plain), plain + 1)
    torch.testing.assert_close(compiled(tagged), tagged * 3)
    tagged.test = 5.0  # a new value: guarded like any attribute
    torch.testing.assert_close(compiled(tagged), tagged * 5)
    torch.testing.assert_close(compiled(plain), plain + 1)


def test_an_attribute_set_on_an_input_tensor_is_set_on_the_callers_tensor():
    def fn(x, flag):
        x.offloading = flag
        return x + 1 if x.offloading else x - 1

    x = torch.ones(3)
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, True), torch.full((3,), 2.0))
    assert x.offloading is True


def test_attributes_set_on_a_tensor_made_inside_are_on_the_returned_tensor():
    def fn(x):
        y = x + 10
        y.grad = x
        y.note = "made inside"
        return y, y.note

    x = torch.ones(5)
    out, note = kiln.compile(fn, backend="eager", fullgraph=True)(x)
    assert note == "made inside" and out.note == "made inside" and out.grad is x
    torch.testing.assert_close(out, x + 10)


def test_tensors_own_attributes_are_not_written_inside_the_graph():
    def fn(x):
        x.requires_grad = True
        return x + 1

    with pytest.raises(kiln.CaptureError, match="setting tensor attribute 'requires_grad'"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.ones(2))


def test_data_of_an_input_set_inside_is_set_on_the_callers_tensor():
    def swap(x, y):
        x.data = y  # x, the same object, over y's memory
        x.add_(1)  # (y's memory: y changes too, as in eager)
        return x

    def handover(x, y):
        z = x
        x.data = y
        y.data = torch.zeros([0])  # x keeps what y held
        return x, z is x

    for fn, requires_grad in ((swap, False), (handover, True)):
        compiled = kiln.compile(fn, backend="eager", fullgraph=True)
        for _ in range(2):
            mine = torch.ones(6, requires_grad=requires_grad), torch.arange(6.0, requires_grad=requires_grad)
            theirs = torch.ones(6, requires_grad=requires_grad), torch.arange(6.0, requires_grad=requires_grad)
            got, want = compiled(*mine), fn(*theirs)
            if fn is swap:
                assert got is mine[0] and torch.equal(got, want) and torch.equal(mine[1], theirs[1])
            else:
                assert got[0] is mine[0] and got[1] is True and torch.equal(got[0], want[0])
                assert mine[1].shape == theirs[1].shape == (0,)
        assert len(compiled.kiln_cache.entries) == 1

    def grad_after(x, y):
        x.data = y
        return x * 2  # (x requires grad: its op after the swap breaks the graph)

    x, y = torch.ones(2, requires_grad=True), torch.full((2,), 3.0)
    with pytest.raises(kiln.CaptureError, match="tensor.data"):
        kiln.compile(grad_after, backend="eager", fullgraph=True)(x, y)


def test_grad_of_an_input_or_parameter_is_read_and_guarded():
    lin = torch.nn.Linear(2, 1)

    def fn(x):
        made = x * 2
        return [torch.ones(p.grad.size()) if p.grad is not None else None for p in lin.parameters()], made.grad, x.grad

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    x = torch.ones(2, 2, requires_grad=True)
    assert compiled(x) == fn(x) == ([None, None], None, None)
    lin(x).sum().backward()  # now every one has a .grad: the guards see it
    got, want = compiled(x), fn(x)
    assert [g.shape for g in got[0]] == [w.shape for w in want[0]] and got[1] is None
    torch.testing.assert_close(got[2], want[2])
    assert got[2] is x.grad


def test_a_containers_class_builds_another():
    import collections

    Pair = collections.namedtuple("Pair", "a b")

    def fn(xs, t, p, d):
        return (xs.__class__(v + 1 for v in xs), t.__class__(v * 2 for v in t), p.__class__(*(v - 1 for v in p)),
                d.__class__(d), type(xs) is xs.__class__)

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    args = [torch.ones(2)], (torch.zeros(2),), Pair(torch.ones(1), torch.ones(1)), {"k": 1}
    got, want = compiled(*args), fn(*args)
    assert [type(g) for g in got] == [type(w) for w in want] and got[4] is True and got[3] == want[3]
    for g, w in zip(got[:3], want[:3]):
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b)


def test_tensor_of_a_list_of_tensors_and_read_numbers():
    def fn(x, n):
        return torch.tensor([x, x * 2], dtype=torch.int64), torch.tensor([[n.item(), 1]])

    check(fn, torch.tensor(20), torch.tensor(3))


def test_python_number_types_are_dtypes_for_torch():
    def fn(x):
        return (x * 5).to(bool).to(float).to(int) + 8

    x = torch.randn(5)
    out = kiln.compile(fn, backend="eager", fullgraph=True)(x)
    assert out.dtype == torch.int64 and torch.equal(out, fn(x))


def test_tensor_type_converts_to_a_legacy_tensor_type_or_its_name():
    def f(a, b):
        m = a.type(torch.HalfTensor)
        return m, b.type(m.type()), b.type("torch.DoubleTensor"), a.type(torch.FloatTensor) is a, a.type(torch.float16)

    check(f, torch.randn(3), torch.randn(3))
