"""Float pointwise ops: transcendental functions, rounding, classification, clamps and the small
formulas of composite ops, with NaN, infinities and signed zeros where eager defines them."""

import math

import torch

from tests.lowering.support import check

aten = torch.ops.aten
SPECIAL = torch.tensor([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-3, 3.7, -3.7, 1e30, float("inf"), float("-inf"), float("nan")])


def test_transcendental_unary_ops():
    x, unit = torch.randn(4, 5) * 2, torch.rand(4, 5) * 1.8 - 0.9
    fn = lambda x, u: (x.tan(), u.asin(), u.acos(), x.atan(), x.sinh(), x.cosh(), x.asinh(), (x.abs() + 1).acosh(),  # noqa: E731
                       u.atanh(), x.exp2(), x.abs().log2(), x.abs().log10(), x.erfc(), x.lgamma(),
                       torch.hypot(x, u), torch.copysign(x, u), torch.atan2(x, u))
    ops = [aten.tan.default, aten.asin.default, aten.acos.default, aten.atan.default, aten.sinh.default, aten.cosh.default,
           aten.asinh.default, aten.acosh.default, aten.atanh.default, aten.exp2.default, aten.log2.default,
           aten.log10.default, aten.erfc.default, aten.lgamma.default, aten.hypot.default, aten.copysign.Tensor]
    programs = check(fn, x, unit, lowered=ops)
    assert not programs["cpp"].externs


def test_rounding_halves_to_even_and_keeps_signed_zeros():
    fn = lambda x, i: (x.trunc(), x.round(), x.frac(), x.floor(), x.ceil(), torch.round(x, decimals=1),  # noqa: E731
                       torch.round(x * 100, decimals=-2), i.round(), i.trunc(), i.floor())
    check(fn, SPECIAL, torch.tensor([-3, 0, 7]), exact=True,
          lowered=[aten.trunc.default, aten.round.default, aten.frac.default, aten.round.decimals])


def test_classification_of_special_values():
    fn = lambda x, i: (x.isnan(), x.isinf(), x.isfinite(), x.isposinf(), x.isneginf(), x.signbit(),  # noqa: E731
                       i.isnan(), i.isinf(), i.isfinite(), i.signbit(), x.sgn(), x.sign())
    check(fn, SPECIAL, torch.tensor([-3, 0, 7]), exact=True,
          lowered=[aten.isnan.default, aten.isinf.default, aten.signbit.default, aten.sgn.default])


def test_nan_to_num_defaults_and_values():
    fn = lambda x: (torch.nan_to_num(x), torch.nan_to_num(x, nan=1.5, posinf=2.0, neginf=-3.0),  # noqa: E731
                    torch.nan_to_num(x, 0.0, None, -1.0))
    check(fn, SPECIAL, exact=True, lowered=[aten.nan_to_num.default])


def test_clamps_propagate_nan_and_promote():
    x, lo, hi, i = SPECIAL, torch.full_like(SPECIAL, -1.0), torch.linspace(-2, 2, len(SPECIAL)), torch.arange(-4, 5)
    fn = lambda x, lo, hi, i: (x.clamp(-1, 2), x.clamp(min=0.5), x.clamp(max=-0.25), torch.clamp(x, lo, hi),  # noqa: E731
                               torch.clamp_min(x, lo), torch.clamp_max(x, hi), i.clamp(-2, 3), i.clamp(0.5),
                               x.clamp(3, 1), x.clamp(min=float("nan")))
    check(fn, x, lo, hi, i, exact=True, lowered=[aten.clamp.default, aten.clamp.Tensor])


def test_lerp_xlogy_heaviside_logical_xor_masked_fill():
    a, b, w = torch.randn(6), torch.randn(6), torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 2.0])
    y = torch.tensor([0.0, 1.0, float("nan"), 2.0, float("inf"), 3.0])
    x = torch.tensor([0.0, 0.0, 0.0, -1.0, 2.0, float("nan")])
    fn = lambda a, b, w, x, y: (torch.lerp(a, b, w), torch.lerp(a, b, 0.3), torch.xlogy(x, y), torch.xlogy(2, y),  # noqa: E731
                                torch.heaviside(x, b), torch.logical_xor(x, y), a.masked_fill(x > -0.5, -1.0),
                                a.masked_fill(w > 0.3, b[2]), a.masked_fill(x.view(6, 1) > 0, 5))
    check(fn, a, b, w, x, y, lowered=[aten.lerp.Tensor, aten.lerp.Scalar, aten.xlogy.Tensor, aten.heaviside.default,
                                      aten.logical_xor.default])


def test_fmod_and_remainder_of_floats():
    a = torch.tensor([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 1.0, float("inf"), 3.0])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.1, 2.0, 0.0])
    fn = lambda a, b: (torch.fmod(a, b), torch.remainder(a, b), torch.fmod(a, 1.5), torch.remainder(a, -1.5),  # noqa: E731
                       a // b, torch.div(a, b, rounding_mode="trunc"), torch.div(a, 0.1, rounding_mode="floor"))
    check(fn, a, b, exact=True, lowered=[aten.fmod.Tensor, aten.remainder.Tensor, aten.div.Tensor_mode])
    assert math.floor(1.0 / 0.1) == 10 and 1.0 // 0.1 == 9.0  # why floor division is not floor(a / b)


def test_products_round_as_eager_near_cancellation():
    # 1 - x * x near x = 1 (asin's and atanh's gradients): eager rounds x * x, then subtracts. A
    # compiler free to fuse a * b + c into one FMA rounds once, and the cancellation magnifies the
    # difference (asin's gradient off by 7e-5, atanh's by 3e-3 at x = -0.9987): kernels compile with
    # -ffp-contract=off, so kiln matches at float32's own tolerances.
    x = torch.cat([torch.linspace(-0.9999, 0.9999, 2001), torch.tensor([-0.9987144470214844, 0.99999])])
    check(lambda x: (1 - x * x, (-x * x + 1).rsqrt(), 1 / (1 - x.pow(2)), x * x + x), x,
          atol=1e-5, rtol=1.3e-6)
    for op in (torch.asin, torch.atanh):
        leaf = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(op(leaf).sum(), leaf)
        (compiled_grad,) = torch.autograd.grad(torch.compile(op, backend="kiln")(leaf).sum(), leaf)
        torch.testing.assert_close(compiled_grad, grad, atol=1e-5, rtol=1.3e-6)
