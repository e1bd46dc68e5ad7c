"""kiln's special functions, each named once with its definition for each code generator.

One `SpecialFunction` per op of `SPECIAL_FUNCTION_UNARY_OPS` and `SPECIAL_FUNCTION_BINARY_OPS`
(kiln/ir/ops.py), grouped by the family whose algorithms they share, with side by side:

- its C++: what the C++ printer prints (kiln/codegen/cpp/printer.py) and the `kiln_<op>` that calls,
  computed in double on the family's algorithms (namespace `kiln_special`) and cast back by the
  caller; `cpp_source()` is their text, which every C++ kernel source includes after kiln's headers
  (kiln/codegen/cpp/preamble.py);
- its Triton: a function of libdevice (NVIDIA's device math library; under Triton's interpreter,
  eager's function stands in for it, kiln/runtime/triton_math.py), or the Triton module's own
  `@triton.jit` helper, whose text `triton_source()` adds to the module's preamble
  (kiln/codegen/triton/module.py), or the reason it has none: graphs using it then call ATen for it.

Why two bodies: a C++ kernel computes one value at a time, so its series run until they converge
and its branches return early; a Triton kernel computes a block of lanes at once, so its loops have
a fixed count and every branch is a `tl.where` over lanes that have all computed it. The Triton
helpers follow the C++ steps where they can, so both generators give the same values.

Adding a special function: its op in kiln/ir/ops.py and its lowering (kiln/lowering/special.py),
and here its entry with both definitions; tests/codegen/test_special_functions.py fails while an op
is defined for one code generator and missing in the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kiln.ir.ops import SPECIAL_FUNCTION_BINARY_OPS, SPECIAL_FUNCTION_UNARY_OPS


@dataclass(frozen=True)
class InDouble:
    """C++: `static inline double kiln_<op>(double <parameters>)` returning `body`; the printer
    passes the operands as doubles and casts the result to the value's type."""

    parameters: str  # the names of the operands, "x" or "s, q"
    body: str

    def call(self, op: str) -> str:
        count = len(self.parameters.split(", "))
        operands = ", ".join(f"double({{{i}}})" for i in range(count))
        # The operands have the value's type (the lowering promotes them alike); the last one's is taken.
        return f"decltype({{{count - 1}}})(kiln_{op}({operands}))"

    def definition(self, op: str) -> str:
        parameters = ", ".join(f"double {name}" for name in self.parameters.split(", "))
        return f"static inline double kiln_{op}({parameters}) {{ return {self.body}; }}"


@dataclass(frozen=True)
class Cpp:
    """C++ written out, for an op that does not compute in double: what the printer prints
    ({0}, {1}: the operands) and the C++ that defines what it calls ("" for the standard library's)."""

    printed: str
    text: str = ""

    def call(self, op: str) -> str:
        return self.printed

    def definition(self, op: str) -> str:
        return self.text


@dataclass(frozen=True)
class Libdevice:
    """Triton: libdevice's function `name`; under Triton's interpreter, `eager` (torch's CPU
    implementation of the op) computes it instead."""

    name: str
    eager: Callable[..., torch.Tensor]


@dataclass(frozen=True)
class TritonHelper:
    """Triton: the module's own `@triton.jit def kiln_<op>`, with the helpers only it calls.
    `printed_by_body`: the Triton body has a method for the op that picks which helper to call."""

    text: str
    printed_by_body: bool = False


@dataclass(frozen=True)
class NotInTriton:
    """Triton has no code for the op: graphs using it call ATen for it (the driver lowers them
    with the op declined, kiln/codegen/triton/body.py's `unprintable_ops`)."""

    why: str


@dataclass(frozen=True)
class SpecialFunction:
    """One special function: its op, and its definition for each code generator."""

    op: str  # its name in the ops protocol
    cpp: InDouble | Cpp
    triton: Libdevice | TritonHelper | NotInTriton

    @property
    def arity(self) -> int:
        return 1 if self.op in SPECIAL_FUNCTION_UNARY_OPS else 2

    @property
    def cpp_call(self) -> str:
        """What the C++ printer prints, {0} and {1} the operands' C++."""
        return self.cpp.call(self.op)

    @property
    def cpp_definition(self) -> str:
        return self.cpp.definition(self.op)

    @property
    def triton_call(self) -> str | None:
        """What the Triton printer prints, {0} and {1} the operands; None where it prints nothing
        from this table (the body's own method, or no Triton code)."""
        operands = ", ".join(f"{{{i}}}" for i in range(self.arity))
        if isinstance(self.triton, Libdevice):
            return f"libdevice.{self.triton.name}({operands})"
        if isinstance(self.triton, TritonHelper) and not self.triton.printed_by_body:
            return f"kiln_{self.op}({operands})"
        return None

    @property
    def triton_definition(self) -> str:
        return self.triton.text if isinstance(self.triton, TritonHelper) else ""


@dataclass(frozen=True)
class Family:
    """Special functions that share algorithms: the C++ ones (inside namespace kiln_special, in
    double), the Triton helpers several of them call, and the functions."""

    cpp: str
    triton: str
    functions: tuple[SpecialFunction, ...]


# What the C++ text starts and ends with: the includes and constants, the namespace the families'
# algorithms are in, then the ops' `kiln_<op>` functions.
_CPP_BEGIN = r"""
// Special functions of kiln's kernels. Each is computed in double from its mathematical definition
// (power series, asymptotic expansions, three-term recurrences, continued fractions, quadrature)
// and cast back to the value's type by the caller; poles, NaN and infinities follow eager PyTorch.

#include <cmath>
#include <cstdint>
#include <limits>

namespace kiln_special {
constexpr double kPi = 3.14159265358979323846, kEulerGamma = 0.57721566490153286061;
constexpr double kInf = std::numeric_limits<double>::infinity(), kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kEps = 1e-17;  // terms this much smaller than the sum no longer change a double
""".strip("\n")
_CPP_END = r"""
}  // namespace kiln_special

// The spellings printer.py uses: each takes and returns doubles; the caller casts.
""".strip("\n")

_NO_TRITON_YET = NotInTriton("libdevice has no such function, and no Triton helper is written for it yet")

GAMMA = Family(
    cpp=r"""
// --- gamma family ---------------------------------------------------------------------------
// psi(x) = ln x - 1/(2x) - sum B_2k / (2k x^2k), accurate to double for x >= 10.
static inline double digamma_asymptotic(double x) {
  static const double b[] = {1.0 / 12, -1.0 / 120, 1.0 / 252, -1.0 / 240, 1.0 / 132, -691.0 / 32760, 1.0 / 12};
  double z = 1 / (x * x), p = z, s = 0;
  for (double c : b) { s += c * p; p *= z; }
  return std::log(x) - 0.5 / x - s;
}

static inline double digamma(double x) {
  if (x == 0) return std::copysign(kInf, -x);
  if (x < 0) {
    if (x == std::floor(x)) return kNaN;  // the poles (and -inf)
    // Reflection psi(x) = psi(1 - x) - pi / tan(pi x); tan has period pi, so reduce x first.
    return digamma(1 - x) - kPi / std::tan(kPi * (x - std::trunc(x)));
  }
  double shift = 0;
  for (; x < 10; x += 1) shift -= 1 / x;  // psi(x) = psi(x + 1) - 1/x
  return shift + digamma_asymptotic(x);
}

// Hurwitz zeta(s, q) = sum_{k>=0} (q + k)^-s by Euler-Maclaurin summation: terms one by one until
// q + k is large enough, then the integral of the rest and its Bernoulli corrections.
static inline double zeta(double s, double q) {
  if (s == 1) return kInf;
  if (s < 1) return kNaN;
  if (std::isinf(s)) return q == 1 ? 1 : q < 1 ? kInf : kNaN;  // eager's values
  if (q <= 0) {
    if (q == std::floor(q)) return kInf;  // a term (q + k)^-s with q + k == 0
    if (s != std::floor(s)) return kNaN;  // a negative base to a fractional power
  }
  const double large = std::fmax(10, s);  // where the corrections below shrink quickly
  double sum = 0, a = q;
  for (; a < large; a += 1) {
    double term = std::pow(a, -s);
    sum += term;
    // The rest is at most term * a / (s - 1): stop once it cannot matter (large s).
    if (a > 1 && std::fabs(term) * (1 + (a + 1) / (s - 1)) <= kEps * std::fabs(sum)) return sum;
  }
  static const double b[] = {1.0 / 12, -1.0 / 720, 1.0 / 30240, -1.0 / 1209600, 1.0 / 47900160,
                             -691.0 / 1307674368000, 1.0 / 74724249600, -3617.0 / 10670622842880000};
  double power = std::pow(a, -s), tail = power * a / (s - 1) + power / 2;
  double rising = s, x = power / a;  // s (s+1) ... (s + 2j - 2) and a^(-s - 2j + 1)
  for (int j = 0; j < 8; ++j) {
    double term = b[j] * rising * x;
    tail += term;
    if (std::fabs(term) <= kEps * std::fabs(sum + tail)) break;
    rising *= (s + 2 * j + 1) * (s + 2 * j + 2);
    x /= a * a;
  }
  return sum + tail;
}

// Trigamma as eager computes it (ATen's native/Math.h `trigamma`), in the value's own type: near the
// poles eager's float32 result carries the rounding of float sin(pi x), up to ~1e-5 relative to the
// true value, and digamma's and polygamma's gradients are this function, so kiln follows eager's
// steps rather than computing the true value in double.
template <typename T>
static inline T trigamma_as_eager(T x) {
  const T pi = T(kPi);
  T sign = 1, result = 0;
  if (x < T(0.5)) {
    sign = -1;
    const T sin_pi_x = std::sin(pi * x);
    result -= (pi * pi) / (sin_pi_x * sin_pi_x);
    x = 1 - x;
  }
  for (int i = 0; i < 6; ++i) {
    result += 1 / (x * x);
    x += 1;
  }
  const T ixx = 1 / (x * x);
  result += (1 + 1 / (2 * x) + ixx * (T(1. / 6) - ixx * (T(1. / 30) - ixx * T(1. / 42)))) / x;
  return sign * result;
}

// psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x) for n >= 1.
static inline double polygamma(double n, double x) {
  if (n == 0) return digamma(x);
  if (n == 1 && std::isinf(x)) return x > 0 ? 0 : kNaN;  // eager's trigamma; higher orders follow zeta
  double sign = std::fmod(n, 2) == 1 ? 1 : -1;
  return sign * std::exp(std::lgamma(n + 1)) * zeta(n + 1, x);
}

// Regularized incomplete gamma: P(a, x) by its power series where it converges fast (x < a + 1),
// Q(a, x) = 1 - P by Legendre's continued fraction (Lentz's evaluation) elsewhere.
static inline double gamma_prefactor(double a, double x) { return std::exp(a * std::log(x) - x - std::lgamma(a)); }

static inline double igamma_series(double a, double x) {
  double term = 1 / a, sum = term;
  for (int n = 1; n < 5000 && std::fabs(term) > kEps * sum; ++n) { term *= x / (a + n); sum += term; }
  return sum * gamma_prefactor(a, x);
}

static inline double igammac_fraction(double a, double x) {
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 5000; ++i) {
    double an = -i * (i - a);
    b += 2;
    d = an * d + b; d = 1 / (std::fabs(d) < tiny ? tiny : d);
    c = b + an / c; c = std::fabs(c) < tiny ? tiny : c;
    h *= d * c;
    if (std::fabs(d * c - 1) < 1e-16) break;
  }
  return h * gamma_prefactor(a, x);
}

// `upper` picks Q(a, x) instead of P(a, x).
static inline double incomplete_gamma(double a, double x, bool upper) {
  // The edge cases in eager's order (a NaN operand still gives a value where one of them decides).
  if (a < 0 || x < 0) return kNaN;
  if (a == 0) return x > 0 ? (upper ? 0 : 1) : kNaN;
  if (x == 0) return upper ? 1 : 0;
  if (std::isinf(a)) return std::isinf(x) ? kNaN : (upper ? 1 : 0);
  if (std::isinf(x)) return upper ? 0 : 1;
  if (a != a || x != x) return kNaN;
  if (x < a + 1) { double p = igamma_series(a, x); return upper ? 1 - p : p; }
  double q = igammac_fraction(a, x);
  return upper ? q : 1 - q;
}
""".strip("\n"),
    triton="",
    functions=(
        SpecialFunction("digamma", InDouble("x", "kiln_special::digamma(x)"), TritonHelper('''
@triton.jit
def kiln_digamma(x):
    # In float64, as the C++ digamma: psi(x) = psi(x + 1) - 1/x up to x >= 10, then
    # the asymptotic series; psi(x) = psi(1 - x) - pi / tan(pi x) below 0; poles give NaN, 0 gives
    # -inf (+inf for -0).
    v = x.to(tl.float64)
    negative = v < 0
    y = tl.where(negative, 1 - v, v)
    shift = tl.where(negative, 0.0, 0.0).to(tl.float64)  # (not y * 0: NaN at y = inf)
    for _ in tl.static_range(10):
        small = y < 10
        shift = tl.where(small, shift - 1 / y, shift)
        y = tl.where(small, y + 1, y)
    z = 1 / (y * y)
    series = z * (1.0 / 12 + z * (-1.0 / 120 + z * (1.0 / 252 + z * (-1.0 / 240 + z * (1.0 / 132 + z * (
        -691.0 / 32760 + z * (1.0 / 12)))))))
    result = shift + libdevice.log(y) - 0.5 / y - series
    pi = 3.141592653589793
    result = tl.where(negative, result - pi / libdevice.tan(pi * (v - libdevice.trunc(v))), result)
    result = tl.where(negative & (v == libdevice.floor(v)), float("nan"), result)
    result = tl.where(v == 0, tl.where(libdevice.signbit(v) != 0, float("inf"), float("-inf")), result)
    return result.to(x.dtype)
'''.strip("\n"))),
        # The order n is the first operand. C++ takes x in its own type: float trigamma follows
        # eager's float steps. Triton prints polygamma of a constant order only
        # (kiln/codegen/triton/body.py): 0 and 1 are digamma and trigamma, higher ones zeta's multiples.
        SpecialFunction("polygamma", Cpp("decltype({1})(kiln_polygamma(double({0}), {1}))", r"""
static inline double kiln_polygamma(double n, double x) { return kiln_special::polygamma(n, x); }
// float (and the half types, through their float conversion): trigamma in float as eager; the rest in double.
static inline float kiln_polygamma(double n, float x) {
  if (n == 1 && !std::isinf(x)) return kiln_special::trigamma_as_eager<float>(x);
  return float(kiln_special::polygamma(n, x));
}
""".strip("\n")), TritonHelper('''
@triton.jit
def kiln_trigamma(x):
    # Eager's steps in x's own type (ATen's trigamma; the C++ trigamma_as_eager): near its
    # poles eager's float result carries float sin(pi x)'s rounding, and kiln matches it.
    pi = tl.full([], 3.141592653589793, x.dtype)
    reflect = x < 0.5
    sin_pi_x = libdevice.sin(pi * x)
    result = tl.where(reflect, -((pi * pi) / (sin_pi_x * sin_pi_x)), 0.0).to(x.dtype)
    y = tl.where(reflect, 1 - x, x)
    for _ in tl.static_range(6):
        result = result + 1 / (y * y)
        y = y + 1
    ixx = 1 / (y * y)
    result = result + (1 + 1 / (2 * y) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / y
    return tl.where(reflect, -result, result)


@triton.jit
def kiln_polygamma_n(n, x):
    # Order n >= 2: (-1)^(n+1) n! zeta(n + 1, x), in float64.
    order = n.to(tl.float64) + x.to(tl.float64) * 0
    sign = tl.where(order.to(tl.int64) % 2 == 1, 1.0, -1.0)
    return (sign * libdevice.exp(libdevice.lgamma(order + 1)) * kiln_zeta(order + 1, x.to(tl.float64))).to(x.dtype)
'''.strip("\n"), printed_by_body=True)),
        SpecialFunction("zeta", InDouble("s, q", "kiln_special::zeta(s, q)"), TritonHelper('''
@triton.jit
def kiln_zeta_tail_term(tail, settled, total, coefficient, rising, x, s, a, k):
    # One term of kiln_zeta's tail, added until a term no longer changes the sum; then the next
    # term's rising factorial and power.
    term = coefficient * rising * x
    tail = tl.where(settled, tail, tail + term)
    settled = settled | (tl.abs(term) <= 1e-17 * tl.abs(total + tail))
    return tail, settled, rising * (s + k) * (s + k + 1), x / (a * a)


@triton.jit
def kiln_zeta(s_in, q_in):
    # Hurwitz zeta in float64, the C++ zeta's steps: terms (q + k)^-s while q + k < max(10, s)
    # (at most 64 of them: below q = -54 the sum starts short), stopping once
    # the rest cannot matter, then the Euler-Maclaurin tail; eager's values at the edges.
    s = s_in.to(tl.float64) + q_in.to(tl.float64) * 0
    q = q_in.to(tl.float64) + s * 0
    large = tl.maximum(s * 0 + 10.0, s)
    total = s * 0
    a = q
    finished = s != s
    for _ in tl.static_range(64):
        active = (a < large) & (finished == 0)
        term = libdevice.pow(a, -s)
        total = tl.where(active, total + term, total)
        finished = finished | (active & (a > 1) & (tl.abs(term) * (1 + (a + 1) / (s - 1)) <= 1e-17 * tl.abs(total)))
        a = tl.where(active & (finished == 0), a + 1, a)
    power = libdevice.pow(a, -s)
    tail = power * a / (s - 1) + power / 2
    rising = s
    x = power / a
    settled = finished
    # The Euler-Maclaurin tail: B_2j / (2j)! s (s+1) ... (s+2j-2) a^(-s-2j+1), j = 1..8.
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, 1.0 / 12, rising, x, s, a, 1)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, -1.0 / 720, rising, x, s, a, 3)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, 1.0 / 30240, rising, x, s, a, 5)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, -1.0 / 1209600, rising, x, s, a, 7)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, 1.0 / 47900160, rising, x, s, a, 9)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, -691.0 / 1307674368000, rising, x, s, a, 11)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, 1.0 / 74724249600, rising, x, s, a, 13)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, -3617.0 / 10670622842880000, rising, x, s, a, 15)
    result = tl.where(finished, total, total + tail)
    integer_q = q == libdevice.floor(q)
    result = tl.where((q <= 0) & (s != libdevice.floor(s)), float("nan"), result)
    result = tl.where((q <= 0) & integer_q, float("inf"), result)
    infinite_s = tl.abs(s) == float("inf")
    result = tl.where(infinite_s, tl.where(q == 1, 1.0, tl.where(q < 1, float("inf"), float("nan"))), result)
    result = tl.where(s < 1, float("nan"), result)
    result = tl.where(s == 1, float("inf"), result)
    return result.to(q_in.dtype)
'''.strip("\n"))),
        SpecialFunction("igamma", InDouble("a, x", "kiln_special::incomplete_gamma(a, x, false)"), _NO_TRITON_YET),
        SpecialFunction("igammac", InDouble("a, x", "kiln_special::incomplete_gamma(a, x, true)"), _NO_TRITON_YET),
    ),
)

ERROR_FUNCTION = Family(
    cpp=r"""
// --- error function family -------------------------------------------------------------------
// exp(x^2) erfc(x); for large x the asymptotic series 1/(x sqrt(pi)) sum (-1)^k (2k-1)!! / (2x^2)^k.
static inline double erfcx(double x) {
  if (x < 10) return std::exp(x * x) * std::erfc(x);
  double r = 1 / (2 * x * x), term = 1, sum = 1;
  for (int k = 1; k < 14; ++k) { term *= -(2 * k - 1) * r; sum += term; }
  return sum / (x * std::sqrt(kPi));
}

// Winitzki's closed form for erfinv(y), given L = ln(1 - y^2); relative error about 1e-3.
static inline double erfinv_estimate(double L) {
  const double a = 0.147, b = 2 / (kPi * a) + L / 2;
  return std::sqrt(std::sqrt(b * b - L / a) - b);
}

// Halley's step for f(x) = g(x) - target, where g is erf or erfc: f'' = -2x f' for both.
static inline double halley_step(double x, double f, double fprime) {
  double newton = f / fprime;
  return x - newton / (1 + x * newton);
}

// x >= 0 with erfc(x) = q, q in (0, 1]; solving with erfc keeps the tails accurate.
static inline double inverse_erfc(double q) {
  double x = erfinv_estimate(std::log(q) + std::log(2 - q));  // 1 - y^2 = q (2 - q)
  for (int i = 0; i < 3; ++i) x = halley_step(x, std::erfc(x) - q, -2 / std::sqrt(kPi) * std::exp(-x * x));
  return x;
}

static inline double erfinv(double y) {
  if (!(std::fabs(y) < 1)) return std::fabs(y) == 1 ? std::copysign(kInf, y) : kNaN;
  if (std::fabs(y) >= 0.5) return std::copysign(inverse_erfc(1 - std::fabs(y)), y);
  double x = std::copysign(erfinv_estimate(std::log1p(-y * y)), y);
  for (int i = 0; i < 3; ++i) x = halley_step(x, std::erf(x) - y, 2 / std::sqrt(kPi) * std::exp(-x * x));
  return x;
}

// The standard normal quantile: Phi(x) = erfc(-x / sqrt 2) / 2 = p.
static inline double ndtri(double p) {
  if (!(p > 0 && p < 1)) return p == 0 ? -kInf : p == 1 ? kInf : kNaN;
  return p < 0.5 ? -std::sqrt(2.0) * inverse_erfc(2 * p) : std::sqrt(2.0) * inverse_erfc(2 * (1 - p));
}
""".strip("\n"),
    triton="",
    functions=(
        SpecialFunction("erfinv", InDouble("x", "kiln_special::erfinv(x)"), Libdevice("erfinv", torch.erfinv)),
        SpecialFunction("erfcx", InDouble("x", "kiln_special::erfcx(x)"), Libdevice("erfcx", torch.special.erfcx)),
        SpecialFunction("ndtri", InDouble("x", "kiln_special::ndtri(x)"), Libdevice("normcdfinv", torch.special.ndtri)),
    ),
)

BESSEL = Family(
    cpp=r"""
// --- Bessel functions of order 0 and 1 -------------------------------------------------------
// The power series of J_n (sign -1) or I_n (sign +1), and the same terms weighted by
// psi(k + 1) + psi(n + k + 1), which make the log-free part of Y_n or K_n.
struct BesselSeries { double plain, weighted; };
static inline BesselSeries bessel_series(int n, double x, double sign) {
  double term = n ? x / 2 : 1, z = sign * x * x / 4, psi_a = -kEulerGamma, psi_b = n - kEulerGamma;
  BesselSeries s{0, 0};
  for (int k = 0; k < 300; ++k) {
    s.plain += term;
    s.weighted += (psi_a + psi_b) * term;
    if (std::fabs(term) <= kEps * std::fabs(s.plain)) break;
    psi_a += 1.0 / (k + 1);
    psi_b += 1.0 / (k + 1 + n);
    term *= z / ((k + 1.0) * (k + 1 + n));
  }
  return s;
}

// Hankel's expansion for large x: P = sum (-1)^k a_2k / x^2k, Q = sum (-1)^k a_2k+1 / x^2k+1 with
// a_k = prod_{j<=k} (4n^2 - (2j-1)^2) / (k! 8^k); the terms are cut where they stop shrinking.
// J_n = sqrt(2/(pi x)) (P cos chi - Q sin chi), Y_n = sqrt(2/(pi x)) (P sin chi + Q cos chi).
static inline double bessel_hankel(int n, double x, bool y) {
  double mu = 4.0 * n * n, term = 1, p = 1, q = 0, previous = kInf;
  for (int k = 1; k < 60; ++k) {
    term *= (mu - (2 * k - 1.0) * (2 * k - 1.0)) / (8 * k * x);
    if (std::fabs(term) >= previous || std::fabs(term) < kEps) break;
    previous = std::fabs(term);
    double signed_term = (k / 2) % 2 ? -term : term;  // (-1)^floor(k/2)
    (k % 2 ? q : p) += signed_term;
  }
  // chi = x - (n/2 + 1/4) pi, expanded so that only cos x and sin x of the exact x are needed.
  double c = std::cos(x), s = std::sin(x), r = std::sqrt(0.5);
  double cos_chi = n ? (s - c) * r : (c + s) * r, sin_chi = n ? -(s + c) * r : (s - c) * r;
  return std::sqrt(2 / (kPi * x)) * (y ? p * sin_chi + q * cos_chi : p * cos_chi - q * sin_chi);
}

static inline double bessel_j(int n, double x) {
  double ax = std::fabs(x), odd = n && x < 0 ? -1 : 1;  // J_1 is odd, J_0 even
  if (ax != ax) return x;
  if (ax >= 12) return std::isinf(ax) ? kNaN : odd * bessel_hankel(n, ax, false);  // NaN at inf as eager
  return bessel_series(n, x, -1).plain;
}

static inline double bessel_y(int n, double x) {
  if (!(x > 0)) return x == 0 ? -kInf : kNaN;
  if (x >= 12) return std::isinf(x) ? kNaN : bessel_hankel(n, x, true);
  BesselSeries s = bessel_series(n, x, -1);
  return 2 / kPi * std::log(x / 2) * s.plain - (n ? 2 / (kPi * x) : 0) - s.weighted / kPi;
}

// I_n(x) scaled by exp(-|x|) when `scaled`: the series, or for large |x| the expansion
// e^x / sqrt(2 pi x) sum (-1)^k a_k / x^k (a_k as in Hankel's).
static inline double bessel_i(int n, double x, bool scaled) {
  double ax = std::fabs(x), odd = n && x < 0 ? -1 : 1;
  if (ax != ax) return x;
  if (ax <= 30) return bessel_series(n, x, 1).plain * (scaled ? std::exp(-ax) : 1);
  double mu = 4.0 * n * n, term = 1, sum = 1;
  for (int k = 1; k < 60 && std::fabs(term) > kEps; ++k) { term *= -(mu - (2 * k - 1.0) * (2 * k - 1.0)) / (8 * k * ax); sum += term; }
  double scale = scaled ? 1 : std::exp(ax / 2);  // e^x as two halves: finite for longer
  return odd * scale * (sum / std::sqrt(2 * kPi * ax)) * scale;
}

// K_n(x) scaled by exp(x) when `scaled`. Small x: the series with the log term. Otherwise the
// trapezoidal rule on K_n(x) e^x = int_0^inf exp(-x (cosh t - 1)) cosh(n t) dt, exact to double for
// a step small beside the integrand's width (about 1/sqrt(x)).
static inline double bessel_k(int n, double x, bool scaled) {
  if (!(x > 0)) return x == 0 ? kInf : kNaN;
  if (std::isinf(x)) return 0;
  if (x <= 2) {
    BesselSeries s = bessel_series(n, x, 1);
    double k = (n ? std::log(x / 2) : -std::log(x / 2)) * s.plain + (n ? 1 / x - s.weighted / 2 : s.weighted / 2);
    return scaled ? k * std::exp(x) : k;
  }
  double h = std::fmin(0.25, 0.5 / std::sqrt(x)), sum = 0.5;
  for (int k = 1; k < 1000; ++k) {
    double t = k * h, sinh_half = std::sinh(t / 2);
    double term = std::exp(-2 * x * sinh_half * sinh_half) * (n ? std::cosh(t) : 1);  // cosh t - 1 = 2 sinh^2(t/2)
    sum += term;
    if (term <= kEps * sum) break;
  }
  return h * sum * (scaled ? 1 : std::exp(-x));
}

// Ai(x): the Maclaurin series Ai(0) f(x) + Ai'(0) g(x) for moderate |x|, else the asymptotic
// expansions in zeta = (2/3)|x|^(3/2) with u_k = (6k-5)(6k-3)(6k-1) / ((2k-1) 216 k) u_(k-1).
static inline double airy_ai(double x) {
  if (!std::isfinite(x)) return kNaN;  // as eager, at both infinities
  if (x >= 5 || x <= -8) {
    double ax = std::fabs(x), zeta = 2.0 / 3 * ax * std::sqrt(ax), u = 1, term = 1, previous = kInf;
    double even = 1, odd = 0, all = 1;  // the oscillating (x < 0) and decaying (x > 0) sums
    for (int k = 1; k < 60; ++k) {
      u *= (6 * k - 5.0) * (6 * k - 3) * (6 * k - 1) / ((2 * k - 1.0) * 216 * k);
      term = u / std::pow(zeta, k);
      if (term >= previous || term < kEps) break;
      previous = term;
      all += k % 2 ? -term : term;
      (k % 2 ? odd : even) += (k / 2) % 2 ? -term : term;
    }
    double root = std::sqrt(kPi) * std::sqrt(std::sqrt(ax));
    if (x > 0) return std::exp(-zeta) * all / (2 * root);
    double phase = zeta + kPi / 4;
    return (std::sin(phase) * even - std::cos(phase) * odd) / root;
  }
  const double ai0 = 0.355028053887817239, aip0 = -0.258819403792806798;
  double x3 = x * x * x, f = 1, g = x, fs = 1, gs = x;
  for (int k = 0; k < 200 && (std::fabs(f) > kEps * std::fabs(fs) || std::fabs(g) > kEps * std::fabs(gs)); ++k) {
    f *= x3 / ((3 * k + 2.0) * (3 * k + 3));
    g *= x3 / ((3 * k + 3.0) * (3 * k + 4));
    fs += f;
    gs += g;
  }
  return ai0 * fs + aip0 * gs;
}

static inline double spherical_bessel_j0(double x) {
  if (std::isinf(x)) return 0;
  return x == 0 ? 1 : std::sin(x) / x;
}
""".strip("\n"),
    triton="",
    functions=(
        SpecialFunction("i0", InDouble("x", "kiln_special::bessel_i(0, x, false)"),
                        Libdevice("cyl_bessel_i0", torch.special.i0)),
        SpecialFunction("i0e", InDouble("x", "kiln_special::bessel_i(0, x, true)"), TritonHelper('''
@triton.jit
def kiln_i0e(x):
    # exp(-|x|) I0(x) in float64: libdevice's I0 below 700, beyond it (where I0 overflows) the
    # asymptotic series, whose next term is below 1e-12 relative there.
    v = tl.abs(x.to(tl.float64))
    near = libdevice.cyl_bessel_i0(tl.minimum(v, 700.0)) * libdevice.exp(-tl.minimum(v, 700.0))
    t = 1 / v
    far = (1 + t * (0.125 + t * (0.0703125 + t * 0.0732421875))) / libdevice.sqrt(6.283185307179586 * v)
    return tl.where(v < 700, near, far).to(x.dtype)
'''.strip("\n"))),
        SpecialFunction("i1", InDouble("x", "kiln_special::bessel_i(1, x, false)"),
                        Libdevice("cyl_bessel_i1", torch.special.i1)),
        SpecialFunction("i1e", InDouble("x", "kiln_special::bessel_i(1, x, true)"), TritonHelper('''
@triton.jit
def kiln_i1e(x):
    # exp(-|x|) I1(x), odd, as kiln_i0e.
    v = tl.abs(x.to(tl.float64))
    near = libdevice.cyl_bessel_i1(tl.minimum(v, 700.0)) * libdevice.exp(-tl.minimum(v, 700.0))
    t = 1 / v
    far = (1 - t * (0.375 + t * (0.1171875 + t * 0.1025390625))) / libdevice.sqrt(6.283185307179586 * v)
    result = tl.where(v < 700, near, far)
    return tl.where(x < 0, -result, result).to(x.dtype)
'''.strip("\n"))),
        SpecialFunction("bessel_j0", InDouble("x", "kiln_special::bessel_j(0, x)"),
                        Libdevice("j0", torch.special.bessel_j0)),
        SpecialFunction("bessel_j1", InDouble("x", "kiln_special::bessel_j(1, x)"),
                        Libdevice("j1", torch.special.bessel_j1)),
        SpecialFunction("bessel_y0", InDouble("x", "kiln_special::bessel_y(0, x)"),
                        Libdevice("y0", torch.special.bessel_y0)),
        SpecialFunction("bessel_y1", InDouble("x", "kiln_special::bessel_y(1, x)"),
                        Libdevice("y1", torch.special.bessel_y1)),
        SpecialFunction("modified_bessel_k0", InDouble("x", "kiln_special::bessel_k(0, x, false)"), _NO_TRITON_YET),
        SpecialFunction("modified_bessel_k1", InDouble("x", "kiln_special::bessel_k(1, x, false)"), _NO_TRITON_YET),
        SpecialFunction("scaled_modified_bessel_k0", InDouble("x", "kiln_special::bessel_k(0, x, true)"),
                        _NO_TRITON_YET),
        SpecialFunction("scaled_modified_bessel_k1", InDouble("x", "kiln_special::bessel_k(1, x, true)"),
                        _NO_TRITON_YET),
        SpecialFunction("airy_ai", InDouble("x", "kiln_special::airy_ai(x)"), _NO_TRITON_YET),
        SpecialFunction("spherical_bessel_j0", InDouble("x", "kiln_special::spherical_bessel_j0(x)"), TritonHelper('''
@triton.jit
def kiln_spherical_bessel_j0(x):
    # sin(x) / x in float64, 1 at 0 and 0 at the infinities, as the C++.
    v = x.to(tl.float64)
    result = tl.where(v == 0, 1.0, libdevice.sin(v) / tl.where(v == 0, 1.0, v))
    return tl.where(tl.abs(v) == float("inf"), 0.0, result).to(x.dtype)
'''.strip("\n"))),
    ),
)

# The degree n is the second operand.
POLYNOMIALS = Family(
    cpp=r"""
// --- orthogonal polynomials of integer degree n (eager truncates n; n < 0 gives 0) -------------
static inline int64_t degree(double n) { return std::fabs(n) < 9e18 ? static_cast<int64_t>(n) : -1; }  // -0.5 -> 0

// p_n from p_0 = 1, p_1 and p_(k+1) = step(k, p_(k-1), p_k).
template <typename Step> static inline double recurrence(double n_value, double p1, Step step) {
  int64_t n = degree(n_value);
  if (n <= 0) return n == 0 ? 1 : 0;
  double p = 1, q = p1;
  for (int64_t k = 1; k < n && q == q; ++k) { double r = step(k, p, q); p = q; q = r; }
  return q;
}

// Chebyshev polynomials: kind 0 = T, 1 = U, 2 = V, 3 = W. All share p_(k+1) = 2x p_k - p_(k-1);
// for |x| < 1 and high degree, their closed forms in theta = acos x take O(1) time.
static inline double chebyshev(int kind, double x, double n) {
  if (std::fabs(x) < 1 && degree(n) > 8) {
    double t = std::acos(x), m = static_cast<double>(degree(n));
    if (kind == 0) return std::cos(m * t);
    if (kind == 1) return std::sin((m + 1) * t) / std::sin(t);
    if (kind == 2) return std::cos((m + 0.5) * t) / std::cos(t / 2);
    return std::sin((m + 0.5) * t) / std::sin(t / 2);
  }
  double p1 = kind == 0 ? x : kind == 1 ? 2 * x : kind == 2 ? 2 * x - 1 : 2 * x + 1;
  return recurrence(n, p1, [x](int64_t, double p, double q) { return 2 * x * q - p; });
}

static inline double hermite_h(double x, double n) {
  return recurrence(n, 2 * x, [x](int64_t k, double p, double q) { return 2 * x * q - 2.0 * k * p; });
}
static inline double hermite_he(double x, double n) {
  return recurrence(n, x, [x](int64_t k, double p, double q) { return x * q - double(k) * p; });
}
static inline double laguerre_l(double x, double n) {
  return recurrence(n, 1 - x, [x](int64_t k, double p, double q) { return ((2.0 * k + 1 - x) * q - double(k) * p) / (k + 1.0); });
}
static inline double legendre_p(double x, double n) {
  return recurrence(n, x, [x](int64_t k, double p, double q) { return ((2.0 * k + 1) * x * q - double(k) * p) / (k + 1.0); });
}
""".strip("\n"),
    triton="",
    functions=(
        SpecialFunction("chebyshev_polynomial_t", InDouble("x, n", "kiln_special::chebyshev(0, x, n)"), _NO_TRITON_YET),
        SpecialFunction("chebyshev_polynomial_u", InDouble("x, n", "kiln_special::chebyshev(1, x, n)"), _NO_TRITON_YET),
        SpecialFunction("chebyshev_polynomial_v", InDouble("x, n", "kiln_special::chebyshev(2, x, n)"), _NO_TRITON_YET),
        SpecialFunction("chebyshev_polynomial_w", InDouble("x, n", "kiln_special::chebyshev(3, x, n)"), _NO_TRITON_YET),
        SpecialFunction("shifted_chebyshev_polynomial_t", InDouble("x, n", "kiln_special::chebyshev(0, 2 * x - 1, n)"),
                        _NO_TRITON_YET),
        SpecialFunction("shifted_chebyshev_polynomial_u", InDouble("x, n", "kiln_special::chebyshev(1, 2 * x - 1, n)"),
                        _NO_TRITON_YET),
        SpecialFunction("shifted_chebyshev_polynomial_v", InDouble("x, n", "kiln_special::chebyshev(2, 2 * x - 1, n)"),
                        _NO_TRITON_YET),
        SpecialFunction("shifted_chebyshev_polynomial_w", InDouble("x, n", "kiln_special::chebyshev(3, 2 * x - 1, n)"),
                        _NO_TRITON_YET),
        SpecialFunction("hermite_polynomial_h", InDouble("x, n", "kiln_special::hermite_h(x, n)"), _NO_TRITON_YET),
        SpecialFunction("hermite_polynomial_he", InDouble("x, n", "kiln_special::hermite_he(x, n)"), _NO_TRITON_YET),
        SpecialFunction("laguerre_polynomial_l", InDouble("x, n", "kiln_special::laguerre_l(x, n)"), _NO_TRITON_YET),
        SpecialFunction("legendre_polynomial_p", InDouble("x, n", "kiln_special::legendre_p(x, n)"), _NO_TRITON_YET),
    ),
)

# frexp and nextafter work in the value's own type: their results depend on its bits.
FLOAT_BITS = Family(
    cpp="",
    triton='''
@triton.jit
def kiln_frexp_parts(x):
    # (mantissa in [0.5, 1) with x's sign, exponent) from x's bits, as std::frexp; subnormals are
    # scaled into the normal range first; 0, infinities and NaN keep x with exponent 0.
    if x.dtype == tl.float64:
        tiny = tl.abs(x) < 2.2250738585072014e-308
        v = tl.where(tiny, x * 18014398509481984.0, x)  # 2^54
        bits = v.to(tl.uint64, bitcast=True)
        field = ((bits >> 52) & 0x7FF).to(tl.int32)
        mantissa = ((bits & 0x800FFFFFFFFFFFFF) | (1022 << 52)).to(tl.float64, bitcast=True)
        exponent = field - 1022 - tl.where(tiny, 54, 0)
    else:
        tiny = tl.abs(x) < 1.1754943508222875e-38
        v = tl.where(tiny, x * 16777216.0, x)  # 2^24
        bits = v.to(tl.uint32, bitcast=True)
        field = ((bits >> 23) & 0xFF).to(tl.int32)
        mantissa = ((bits & 0x807FFFFF) | (126 << 23)).to(tl.float32, bitcast=True)
        exponent = field - 126 - tl.where(tiny, 24, 0)
    special = (x == 0) | (x != x) | (tl.abs(x) == float("inf"))
    return tl.where(special, x, mantissa), tl.where(special, 0, exponent)
'''.strip("\n"),
    functions=(
        SpecialFunction("frexp_mantissa", Cpp("kiln_frexp_mantissa({0})", r"""
// frexp works in the value's own type: the mantissa keeps its bits, the exponent is int32.
template <typename T> static inline T kiln_frexp_mantissa(T x) { int e; return std::frexp(x, &e); }
""".strip("\n")), TritonHelper('''
@triton.jit
def kiln_frexp_mantissa(x):
    mantissa, _ = kiln_frexp_parts(x)
    return mantissa
'''.strip("\n"))),
        SpecialFunction("frexp_exponent", Cpp("kiln_frexp_exponent({0})", r"""
template <typename T> static inline int32_t kiln_frexp_exponent(T x) { int e = 0; std::frexp(x, &e); return std::isfinite(x) ? e : 0; }
""".strip("\n")), TritonHelper('''
@triton.jit
def kiln_frexp_exponent(x):
    _, exponent = kiln_frexp_parts(x)
    return exponent
'''.strip("\n"))),
        SpecialFunction("nextafter", Cpp("std::nextafter({0}, {1})"), Libdevice("nextafter", torch.nextafter)),
    ),
)

FAMILIES = (GAMMA, ERROR_FUNCTION, BESSEL, POLYNOMIALS, FLOAT_BITS)
SPECIAL_FUNCTIONS = {function.op: function for family in FAMILIES for function in family.functions}


def cpp_source(families: tuple[Family, ...] = FAMILIES) -> str:
    """The C++ every C++ kernel source includes: the families' algorithms, then each op's `kiln_<op>`."""
    algorithms = "\n\n".join(family.cpp for family in families if family.cpp)
    definitions = [f.cpp_definition for family in families for f in family.functions if f.cpp_definition]
    return "\n".join([_CPP_BEGIN, "", algorithms, _CPP_END, *definitions]) + "\n"


def triton_source(families: tuple[Family, ...] = FAMILIES) -> str:
    """The `@triton.jit` helpers of the Triton module's preamble that define special functions."""
    texts = [text for family in families for text in [family.triton, *(f.triton_definition for f in family.functions)]]
    return "\n\n\n".join(text for text in texts if text)


def libdevice_stand_ins() -> dict[str, Callable[..., torch.Tensor]]:
    """libdevice's function name -> eager's function, for each special function libdevice computes."""
    return {f.triton.name: f.triton.eager for f in SPECIAL_FUNCTIONS.values() if isinstance(f.triton, Libdevice)}
