"""Smaller lowerings: NaN-ignoring max/min, activations, copy, integer powers, flip, repeat,
max/min with indices and vector norms."""

import math

import torch
import torch.nn.functional as F

from tests.lowering.support import check, through

aten = torch.ops.aten


def test_activations_fmax_fmin_and_powers():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0, float("nan"), float("-inf"), 1.0])
    y = torch.tensor([1.0, float("nan"), -1.0, 0.5, float("nan"), 2.0, 0.0, float("nan")])
    i = torch.tensor([-3, 0, 2, 5, 7, 1, -1, 4])
    fn = lambda x, y, i: (torch.fmax(x, y), torch.fmin(x, y), F.hardtanh(x), F.relu6(x * 4), F.leaky_relu(x, 0.2),  # noqa: E731
                          F.elu(x), F.selu(x), i ** 3, 2 ** x, i ** 0, (i > 0) ** 2)
    check(fn, x, y, i, lowered=[aten.fmax.default, aten.fmin.default, aten.hardtanh.default, aten.leaky_relu.default,
                                aten.elu.default, aten.pow.Tensor_Scalar, aten.pow.Scalar])


def test_flip_repeat_and_copy():
    x = torch.randn(3, 4).t()

    def fn(x, buf):
        buf = buf.clone()
        buf.copy_(x[0])  # a functional copy in the graph: x[0] broadcast into buf's shape and dtype
        return x.flip(0), x.flip((0, -1)), x.repeat(2, 1), x.repeat(2, 1, 3), x[:0].repeat(2, 2), buf

    check(fn, x, torch.zeros(2, 3, dtype=torch.float64), lowered=[aten.flip.default, aten.repeat.default, aten.copy.default])


def test_max_min_with_indices_and_vector_norms():
    x = torch.randn(4, 5)
    x[1, 2] = float("nan")
    fn = lambda x: (x.max(1), x.min(0, keepdim=True), x.max(), x.min(), torch.linalg.vector_norm(x.nan_to_num(), dim=1),  # noqa: E731
                    torch.linalg.vector_norm(x, ord=math.inf), torch.linalg.vector_norm(x, ord=0, dim=0),
                    torch.linalg.vector_norm(x.nan_to_num(), ord=3, dim=(0, 1), keepdim=True),
                    torch.linalg.vector_norm(x.nan_to_num(), ord=1, dim=1), torch.linalg.vector_norm(x.nan_to_num(), ord=-math.inf))
    check(fn, x, lowered=[aten.max.dim, aten.min.dim, aten.max.default, aten.min.default, aten.linalg_vector_norm.default])


def test_small_constant_powers_are_products_as_in_eager():
    # x.pow(2) must round as x*x (eager's kernel); exp(2 log x) differs in the last bit, and T5's
    # ReLU masks downstream of its variance flipped.
    x = torch.randn(64, 512)
    fn = lambda x: (x.pow(2), x.pow(3), x.abs().pow(-0.5), x.pow(-1), x.pow(-2), x.abs().pow(0.5), x.abs().pow(2.5))  # noqa: E731
    out, program = through("cpp", fn, x)
    for got, want in zip(out[:5], fn(x)[:5]):
        assert torch.equal(got, want)
    torch.testing.assert_close(out[5:], fn(x)[5:])  # sqrt is correctly rounded; eager's pow(x, 0.5) is not
    assert program.kernels and not program.externs
