"""Special functions as kiln's own kernels (kiln/codegen/special_functions.py): values against eager float32
over their interesting ranges (poles, zeros, tails, large arguments, NaN and infinities), and no
ATen extern left for any of them. Many ops share a graph, so that few compilations cover them all."""

import math

import torch

from tests.lowering.support import check

aten = torch.ops.aten
S = torch.special
NAN, INF = math.nan, math.inf
TOL = dict(atol=1e-4, rtol=1e-4)


def _values(*parts) -> torch.Tensor:
    return torch.cat([torch.as_tensor(p, dtype=torch.float32).flatten() for p in parts])


# Negative and positive arguments, near 0 and near the poles of the gamma family, large ones, and
# the special values (eager defines each function there).
EDGES = [0.0, -0.0, INF, -INF, NAN, 1e-30, -1e-30, 1e-6, 0.5, -0.5, 1.0, -1.0, -2.0, -2.5, 3.0]
WIDE = _values(torch.linspace(-30, 30, 241), torch.logspace(-6, 2.3, 60), -torch.logspace(-6, 2.3, 60), EDGES)


def test_gamma_family():
    # Halfway between and near the poles (negative integers); exactly at them eager's float32 trigamma
    # is a large finite number where kiln gives the true infinity, and eager's float32 loses accuracy
    # within about 1e-2 of them.
    x = _values(torch.arange(-9.95, 10, 0.1), torch.logspace(-5, 4, 40), [-0.98, -1.02, -3.03], EDGES)
    x = x[(x >= 0) | (x != x.round()) | x.isinf()]
    fn = lambda x: (torch.digamma(x), torch.polygamma(0, x), torch.polygamma(1, x), torch.polygamma(2, x),  # noqa: E731
                    torch.polygamma(3, x), torch.polygamma(4, x), S.polygamma(2, x))
    check(fn, x, lowered=[aten.digamma.default, aten.polygamma.default], **TOL)


def test_trigamma_float32_as_eager():
    # Eager computes float32 trigamma (polygamma(1, x), and so digamma's gradient) in float, whose
    # sin(pi x) near the poles is off by up to ~1e-5 relative (1377.0603 for 1377.0507 at -3.973): kiln
    # takes the same steps, so it matches at float32's own tolerances, at the poles too (eager's large
    # finite values), and gradients of digamma follow.
    x = _values(torch.linspace(-9.99, 0.49, 400), [-3.973021984100342, -0.98, -1.02, -3.03, -1.0, -4.0], EDGES)
    f32 = dict(atol=1e-5, rtol=1.3e-6)  # torch.testing's float32 defaults
    check(lambda x: torch.polygamma(1, x), x, lowered=[aten.polygamma.default], **f32)
    x = x[x.isfinite() & (x != x.round())].requires_grad_()
    (grad,) = torch.autograd.grad(torch.digamma(x).sum(), x)
    (compiled_grad,) = torch.autograd.grad(torch.compile(torch.digamma, backend="kiln")(x).sum(), x)
    torch.testing.assert_close(compiled_grad, grad, **f32)


def test_zeta_and_incomplete_gamma():
    v = _values([0.0, 1e-5, 0.1, 0.5, 0.999, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.5, 100.0, 1e3, 1e4, INF, NAN, -1.0, -2.5])
    a, x = v[:, None].expand(-1, len(v)), v[None, :].expand(len(v), -1)
    fn = lambda a, x: (S.zeta(a, x), torch.igamma(a, x), torch.igammac(a, x), S.zeta(a, 2.0),  # noqa: E731
                       S.zeta(3.0, x), S.gammainc(a, x), S.gammaincc(a, x))
    check(fn, a.contiguous(), x.contiguous(),
          lowered=[aten.special_zeta.default, aten.special_zeta.other_scalar, aten.special_zeta.self_scalar,
                   aten.igamma.default, aten.igammac.default], **TOL)


def test_error_function_family():
    unit = _values(torch.linspace(-1, 1, 401), [0.9999999, -0.9999999, 1e-7, -1e-7, 1.5, -1.5], EDGES)
    prob = _values(torch.linspace(0, 1, 401), [1e-30, 1e-10, 1 - 1e-7, 1.5, -0.5], EDGES)
    fn = lambda x, u, p: (S.erfcx(x), S.log_ndtr(x), torch.erfinv(u), S.ndtri(p))  # noqa: E731
    check(fn, WIDE, unit, prob, lowered=[aten.special_erfcx.default, aten.erfinv.default, aten.special_ndtri.default],
          **TOL)


def test_bessel_functions():
    x = _values(WIDE, torch.linspace(11, 13, 41), torch.linspace(1.9, 2.1, 9), [700.0, 1e4, 1e6])
    fn = lambda x: (torch.i0(x), S.i0e(x), S.i1(x), S.i1e(x), S.bessel_j0(x), S.bessel_j1(x), S.bessel_y0(x),  # noqa: E731
                    S.bessel_y1(x), S.modified_bessel_i0(x), S.modified_bessel_i1(x), S.modified_bessel_k0(x),
                    S.modified_bessel_k1(x), S.scaled_modified_bessel_k0(x), S.scaled_modified_bessel_k1(x),
                    S.spherical_bessel_j0(x))
    names = ["i0", "special_i0e", "special_i1", "special_i1e", "special_bessel_j0", "special_bessel_j1",
             "special_bessel_y0", "special_bessel_y1", "special_modified_bessel_i0", "special_modified_bessel_i1",
             "special_modified_bessel_k0", "special_modified_bessel_k1", "special_scaled_modified_bessel_k0",
             "special_scaled_modified_bessel_k1", "special_spherical_bessel_j0"]
    check(fn, x, lowered=[getattr(aten, n).default for n in names], **TOL)


def test_airy_ai():
    # Below about -100 eager's float32 phase drifts by more than the tolerance (its float64 agrees with kiln).
    x = _values(torch.linspace(-100, 30, 521), torch.linspace(-8.5, -7.5, 11), torch.linspace(4.5, 5.5, 11), EDGES)
    check(lambda x: S.airy_ai(x), x, lowered=[aten.special_airy_ai.default], **TOL)


def test_orthogonal_polynomials():
    x = _values(torch.linspace(-3, 3, 61), [1.0, -1.0, 0.0, 0.5, 0.999, -0.999, 10.0, -10.0, INF, -INF])
    n = _values([-2, -1, -0.5, 0, 1, 2, 3, 3.7, 5, 6, 7, 9, 10, 25])  # eager truncates a fractional degree
    xs, ns = x[:, None].expand(-1, len(n)).contiguous(), n[None, :].expand(len(x), -1).contiguous()
    names = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
             "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
             "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
             "laguerre_polynomial_l", "legendre_polynomial_p"]
    fns = [getattr(S, name) for name in names]
    # Tensor degrees (float and int64), a Python degree and a Python x.
    fn = lambda x, n, k: tuple(f(x, n) for f in fns) + tuple(f(x, k) for f in fns) + (fns[0](x, 4), fns[9](0.5, k))  # noqa: E731
    packets = [getattr(aten, f"special_{name}") for name in names]
    lowered = [p.default for p in packets] + [packets[0].n_scalar, packets[9].x_scalar]
    check(fn, xs, ns, ns.long(), lowered=lowered, **TOL)


def test_float_helpers():
    x = _values(torch.randn(40) * 100, [0.0, -0.0, 1.0, -1.0, 1e-40, -3e38, INF, -INF, NAN, 0.75, 2.5])
    y = _values(torch.randn(40) * 100, [0.0, 0.0, 1.0, 2.0, 0.0, -INF, 0.0, 1.0, 0.0, NAN, 2.5])
    e = torch.randint(-10, 10, x.shape, dtype=torch.int32)
    i = torch.tensor([-3, 0, 5, -1])
    fn = lambda x, y, e, i: (torch.frexp(x)[0], torch.frexp(x)[1], torch.nextafter(x, y), torch.ldexp(x, e), torch.angle(x),  # noqa: E731
                             torch.angle(i))
    check(fn, x, y, e, i, exact=True,
          lowered=[aten.frexp.Tensor, aten.nextafter.default, aten.ldexp.Tensor, aten.angle.default])


def test_integer_and_double_operands():
    # Integers promote to float32 as in eager; float64 computes (and is compared) in float64.
    i = torch.tensor([-3, -1, 0, 1, 2, 7, 12])
    d = torch.linspace(-20, 20, 81, dtype=torch.float64) + 0.3  # off the poles
    fn = lambda i, d: (torch.digamma(i), torch.i0(i), S.bessel_y0(i), S.ndtri(i), torch.angle(i),  # noqa: E731
                       S.chebyshev_polynomial_t(i, i), S.zeta(i, 3), torch.polygamma(1, d), S.airy_ai(d),
                       S.modified_bessel_k1(d), S.hermite_polynomial_h(d, 4), torch.igammac(d.abs(), d * d))
    check(fn, i, d, lowered=[aten.digamma.default, aten.i0.default, aten.special_bessel_y0.default,
                             aten.special_airy_ai.default, aten.polygamma.default, aten.special_zeta.other_scalar],
          atol=1e-5, rtol=1e-5)  # eager's float64 Ai is off by 2e-5 (relative) near -2.2; kiln's is not
