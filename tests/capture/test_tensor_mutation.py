"""In-place tensor operations inside the captured code: item assignment and `op_` methods, on
tensors made in the frame and on the caller's own tensors, through each backend."""

import operator

import pytest
import torch

import kiln
from tests.capture.util import check


def _assignments(x, mask, rows):
    y = x.clone()
    y[0] = 5.0
    y[1:, :2] = -1.0
    y[mask] = 0.5
    y[rows] = y[rows] * 3
    operator.setitem(y, (..., -1), 7.0)
    y.add_(1).mul_(2)
    return y


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_item_assignment_and_in_place_methods_on_a_new_tensor(backend):
    x = torch.randn(4, 3)
    check(_assignments, x, x > 1, torch.tensor([0, 2]), backend=backend)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_caller_tensor_changed_in_place(backend):
    def f(x, buf):
        buf[0] = x.sum()
        buf.add_(x[:2])
        x.mul_(2)
        return buf * 2

    check(f, torch.randn(2), torch.zeros(2), backend=backend)


def test_assignment_through_a_view_reaches_the_base():
    def f(x):
        y = x.clone()
        v = y.view(2, 2)
        v[1] = 9.0
        y.t_() if y.dim() == 2 else None
        return y, v

    check(f, torch.randn(4))


def test_an_in_place_op_returns_the_tensor_it_wrote():
    # (`y = x.add_(1)` is x itself: `y is x`, and a set of both holds one tensor)
    def fn(x, other):
        y = x.add_(1)
        z = torch.Tensor.add_(y, 1)
        w = x
        w += 1
        return y is x, z is x, w is x, len({x, y, z}), y in {other}

    x = torch.zeros(3)
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    assert compiled(x, torch.ones(1)) == (True, True, True, 1, False)
    assert compiled(x, x) == (True, True, True, 1, True)  # one tensor passed twice is one tensor
    torch.testing.assert_close(x, torch.full((3,), 6.0))


def test_is_inference_of_an_input_is_guarded():
    def fn(x):
        return x + 1 if x.is_inference() else x - 1

    with torch.inference_mode():
        inference = torch.ones(2)
    compiled = kiln.compile(fn, backend="eager")
    torch.testing.assert_close(compiled(torch.ones(2)), torch.zeros(2))
    torch.testing.assert_close(compiled(inference), torch.full((2,), 2.0))
