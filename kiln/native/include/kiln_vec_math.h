// kiln_vec_math.h: elementwise math on GCC vector-extension types, for kiln's generated kernels.
//
// Every function is a template over the vector type V (e.g. `float __attribute__((vector_size(64)))`);
// the element type T and lane count come from V, so the same code serves float x16, double x16
// (128 bytes: two AVX-512 registers), NEON's float x4, and so on. Only vector-extension operators,
// __builtin_convertvector and plain lane loops are used, never <immintrin.h>.
//
// Semantics follow eager PyTorch (and so C's libm) without -ffast-math: NaN in gives NaN out,
// infinities and signed zeros come out as std:: would give them, overflow gives inf and underflow
// is gradual (denormal results, not flushed).
//
// float32: real vector algorithms (range reduction + minimax polynomial), within 4 ulp (most
//   within 1.5; erf within 5 ulp just below 1; tests/codegen/test_vec_math.py holds the bounds).
// float64: a lane loop over the std:: function, except abs, floor/ceil/trunc/round, sign,
//   maximum/minimum, reciprocal and sigmoid's outer arithmetic, which are vector code for both.
//
// Lane loops and what g++ 12 -O2 or -O3 -march=native (x86-64) makes of them:
//   std::nearbyint, std::fma          -> one vrndscaleps/pd, vfmadd...ps/pd per register (vectorized;
//                                        without FMA hardware std::fma is a slow but exact call)
//   std::sqrt                         -> scalar vsqrtss plus an errno branch per lane: libm's sqrt
//                                        sets errno, so it vectorizes (vsqrtps) only under
//                                        -fno-math-errno; results are exact either way
//   std::floor/ceil/trunc             -> scalar under -ftrapping-math, so those are built from
//                                        nearbyint instead (vectorized)
//   std::exp/log/sin/... (double), std::lgamma, std::pow (double), huge-argument sin/cos/tan
//                                     -> scalar libm calls
//
// Polynomial coefficients were fitted for this file: a Remez exchange (mpmath, 40 digits) for the
// minimax polynomial on the stated interval and weight (relative error unless said), then the
// coefficients rounded to float one at a time, lowest first, refitting the others each time
// (Lawson's reweighted least squares) to absorb the rounding. "E" is the resulting maximum
// weighted error with the float coefficients. A constant split hi + lo is the float nearest to it
// and the float nearest to the remainder.

#ifndef KILN_VEC_MATH_H
#define KILN_VEC_MATH_H

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

namespace kiln_vm {

// ---------------------------------------------------------------- types and lane helpers

template <class V>
using elem_t = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<V>()[0])>>;

template <class V>
inline constexpr int lanes = int(sizeof(V) / sizeof(elem_t<V>));

// The integer vectors with V's lane count and element width (int32 for float, int64 for double).
template <class V>
struct int_vec {
  using S = std::conditional_t<sizeof(elem_t<V>) == 4, int32_t, int64_t>;
  using U = std::make_unsigned_t<S>;
  typedef S si __attribute__((vector_size(sizeof(V))));
  typedef U ui __attribute__((vector_size(sizeof(V))));
};
template <class V> using si_t = typename int_vec<V>::si;
template <class V> using ui_t = typename int_vec<V>::ui;

// Bit patterns (a cast between same-size vector types reinterprets). Bit arithmetic is done on the
// unsigned type, where wrap-around is defined.
template <class V> static inline ui_t<V> bits(V x) { return (ui_t<V>)x; }
template <class V> static inline V from_bits(ui_t<V> u) { return (V)u; }

// v - 0 is v for every v (0 + v would turn -0 into +0), so the compiler folds it to a broadcast.
template <class V> static inline V splat(elem_t<V> v) { return v - V{}; }
template <class V, class M> static inline V sel(M m, V a, V b) { return m ? a : b; }

template <class V, class F> static inline V map(V x, F f) {
  V r = x;
  for (int i = 0; i < lanes<V>; ++i) r[i] = f(x[i]);
  return r;
}
template <class V, class F> static inline V map2(V x, V y, F f) {
  V r = x;
  for (int i = 0; i < lanes<V>; ++i) r[i] = f(x[i], y[i]);
  return r;
}

// Exact fused multiply-add on every target; one vfmadd per register where the hardware has FMA.
template <class V> static inline V fma(V a, V b, V c) {
  V r = a;
  for (int i = 0; i < lanes<V>; ++i) r[i] = std::fma(a[i], b[i], c[i]);
  return r;
}
// Round to nearest, ties to even (vectorized: vrndscaleps/pd, NEON frintx).
template <class V> static inline V rint(V x) { return map(x, [](elem_t<V> v) { return std::nearbyint(v); }); }

template <class V> static inline bool any(si_t<V> m) {
  bool r = false;
  for (int i = 0; i < lanes<V>; ++i) r |= m[i] != 0;
  return r;
}

template <class V> static inline ui_t<V> sign_mask() {
  using U = typename int_vec<V>::U;
  return ui_t<V>{} + (U(1) << (8 * sizeof(U) - 1));
}
template <class V> static inline V abs(V x) { return from_bits<V>(bits(x) & ~sign_mask<V>()); }
// |mag| with the sign bit of sgn.
template <class V> static inline V copysign(V mag, V sgn) {
  return from_bits<V>((bits(mag) & ~sign_mask<V>()) | (bits(sgn) & sign_mask<V>()));
}
template <class V> static inline si_t<V> is_nan(V x) { return x != x; }

// Horner's scheme with fma, highest coefficient last: c[0] + x (c[1] + x (c[2] + ...)).
template <class V, std::size_t K> static inline V poly(V x, const float (&c)[K]) {
  V r = splat<V>(c[K - 1]);
#pragma GCC unroll 16
  for (int k = int(K) - 2; k >= 0; --k) r = fma(r, x, splat<V>(c[k]));
  return r;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kMagic = 0x1.8p23f;  // x + kMagic - kMagic rounds x to an integer (|x| < 2^22)

constexpr float kLn2Hi = 0x1.62e430p-1f, kLn2Lo = -0x1.05c610p-29f;
constexpr float kPio2Hi = 0x1.921fb6p+0f, kPio2Lo = -0x1.777a5cp-25f;
constexpr float kPio4Hi = 0x1.921fb6p-1f, kPio4Lo = -0x1.777a5cp-26f;
constexpr float kPiHi = 0x1.921fb6p+1f, kPiLo = -0x1.777a5cp-24f;
constexpr float k3Pio4Hi = 0x1.2d97c8p+1f, k3Pio4Lo = -0x1.99bc5cp-28f;

// 2^k for integer lanes k in [-126, 127], built in the exponent field.
template <class V> static inline V pow2i(ui_t<V> k) { return from_bits<V>((k + 127u) << 23); }

// ---------------------------------------------------------------- float32: exp family

// expm1(r) on |r| <= ln2/2 as r + r^2 P(r); P fitted to (expm1(r) - r)/r^2 weighted by
// r/expm1(r) (the relative error of expm1 divided by r): E = 6.5e-8, so expm1 is within 2.2e-8
// and 1 + expm1 within 1e-8, relative.
template <class V> static inline V expm1_poly(V r) {
  static constexpr float c[] = {0.5f, 0.166665822f, 0.0416669361f, 0.00836264901f, 0.00138884387f};
  return fma(r * r, poly(r, c), r);
}

// x = n ln2 + r with n = rint(x / ln2), |r| <= ln2/2 (Cody-Waite: n ln2_hi is exact in the fma
// and x - n ln2_hi is exact by Sterbenz's lemma). x must be NaN or within |x| < 2^21.
template <class V> static inline V exp_reduce(V x, ui_t<V> &n) {
  V t = x * 1.44269502f + kMagic;
  V nf = t - kMagic;
  n = bits(t) - bits(splat<V>(kMagic));
  return fma(nf, splat<V>(-kLn2Lo), fma(nf, splat<V>(-kLn2Hi), x));
}

// e^x 2^-bias for x in [-104, 90] (or NaN), without intermediate overflow or underflow: 2^(n-bias)
// is applied as two factors so that gradual underflow rounds once, in the last multiply.
template <class V> static inline V exp_core(V x, int bias) {
  ui_t<V> n;
  V r = exp_reduce(x, n);
  V p = 1.0f + expm1_poly(r);
  ui_t<V> k = n - unsigned(bias);
  ui_t<V> h = (ui_t<V>)((si_t<V>)k >> 1);
  return (p * pow2i<V>(h)) * pow2i<V>(k - h);
}

// Clamp to [lo, hi], NaN kept.
template <class V> static inline V clamp(V x, float lo, float hi) {
  x = sel(x > hi, splat<V>(hi), x);
  return sel(x < lo, splat<V>(lo), x);
}

template <class V> static inline V exp_f32(V x) {
  // Beyond [-104, 89] the result is 0 or inf; the clamp keeps n within the scaling's range.
  return exp_core(clamp(x, -104.0f, 89.0f), 0);
}

// e^x for x <= 0 (or NaN), as exp_f32 gives it in fewer operations: one clamp, and 2^n applied as
// p 2^(n+64), exact (a normal number for every n in [-150, 0]), times 2^-64, which rounds once
// where the result is denormal. A NaN stays NaN through the multiplies, whatever its n. sigmoid
// and tanh need only these arguments. (kiln_attention.h's softmax has its own, which flushes
// below -87 to 0: masked scores of -1e9 would otherwise make denormals, slow on x86.)
template <class V> static inline V exp_nonpositive_f32(V x) {
  ui_t<V> n;
  V p = 1.0f + expm1_poly(exp_reduce(sel(x < -104.0f, splat<V>(-104.0f), x), n));
  return (p * pow2i<V>(n + 64u)) * 0x1p-64f;
}

template <class V> static inline V expm1_f32(V x) {
  // Below -18, e^x < 2^-25 and expm1 rounds to -1.
  V xc = clamp(x, -18.0f, 89.0f);
  ui_t<V> n;
  V q = expm1_poly(exp_reduce(xc, n));
  // expm1(x) = 2^n q + (2^n - 1): both terms exact for n <= 24, so one rounding (in the fma).
  V s = pow2i<V>(sel((si_t<V>)n > 24, ui_t<V>{} + 0u, n));
  V small = fma(s, q, s - 1.0f);
  ui_t<V> h = (ui_t<V>)((si_t<V>)n >> 1);
  V big = ((q + 1.0f) * pow2i<V>(h)) * pow2i<V>(n - h) - 1.0f;
  V r = sel((si_t<V>)n > 24, big, small);
  return sel(x == 0.0f, x, r);  // keeps -0
}

// ---------------------------------------------------------------- float32: log family

// log1p(f) on [sqrt(1/2) - 1, sqrt(2) - 1] as f - f^2/2 + f^3 P(f); P fitted to
// (log1p(f) - f + f^2/2)/f^3 weighted by f/log1p(f): E = 1.4e-7, so 2.4e-8 relative on log1p.
// Returns the tail log1p(f) - f, so that callers can add k ln2 + f first.
template <class V> static inline V log1p_tail(V f) {
  static constexpr float c[] = {0.333333284f,  -0.250002921f, 0.200014457f, -0.166423514f,
                                0.142031834f, -0.129727319f, 0.127038181f, -0.0808771551f};
  V f2 = f * f;
  return f2 * fma(f, poly(f, c), splat<V>(-0.5f));
}

// k such that x 2^-k lies in [sqrt(1/2), sqrt(2)), for positive normal x; the mantissa m = x 2^-k.
template <class V> static inline si_t<V> log_exponent(V x, V &m) {
  ui_t<V> d = bits(x) - 0x3f3504f3u;  // bits of sqrt(1/2)
  si_t<V> k = (si_t<V>)d >> 23;
  m = from_bits<V>(bits(x) - ((ui_t<V>)k << 23));
  return k;
}

template <class V> static inline V log_f32(V x) {
  si_t<V> tiny = x < 0x1p-126f;  // denormals: scale into the normal range first
  V xs = sel(tiny, x * 0x1p23f, x);
  V m;
  si_t<V> k = log_exponent(xs, m) - sel(tiny, si_t<V>{} + 23, si_t<V>{});
  V f = m - 1.0f;  // exact
  V kf = __builtin_convertvector(k, V);
  // k ln2 + log1p(f), adding the large, exact parts first: k ln2_hi + f is exact or rounds once.
  V r = fma(kf, splat<V>(kLn2Hi), f) + fma(kf, splat<V>(kLn2Lo), log1p_tail(f));
  V special = sel(x == 0.0f, splat<V>(-kInf), sel(x > 0.0f, x, splat<V>(kNaN)));
  return sel((x > 0.0f) & (x < kInf), r, special);
}

template <class V> static inline V log1p_f32(V x) {
  // log1p(x) = k ln2 + log1p(f), 1 + f = (1 + x) 2^-k; k comes from the rounded 1 + x but f is
  // computed exactly from x: f = x 2^-k + (2^-k - 1), one rounding, exact for k = 0.
  V u = 1.0f + x;
  V m;
  si_t<V> k = log_exponent(u, m);
  V s = pow2i<V>((ui_t<V>)-sel(k > 24, si_t<V>{}, k));
  V f = sel(k > 24, m - 1.0f, fma(x, s, s - 1.0f));  // above 2^24, 1 + x is x: use its mantissa
  V kf = __builtin_convertvector(k, V);
  V r = fma(kf, splat<V>(kLn2Hi), f) + fma(kf, splat<V>(kLn2Lo), log1p_tail(f));
  V special = sel(x == -1.0f, splat<V>(-kInf), sel(x > 0.0f, x, splat<V>(kNaN)));
  r = sel((x > -1.0f) & (x < kInf), r, special);
  return sel(x == 0.0f, x, r);  // keeps -0
}

// ---------------------------------------------------------------- float32: trigonometric

// sin r = r + r^3 P(r^2) on |r| <= pi/4; P fitted to (sin r - r)/r^3 in s = r^2 weighted by
// r/sin r: E = 2.5e-8, so 1.5e-8 relative on sin.
template <class V> static inline V sin_poly(V r) {
  static constexpr float c[] = {-0.166666642f, 0.00833266601f, -0.000195714674f};
  V s = r * r;
  return fma(r * s, poly(s, c), r);
}
// cos r = 1 - r^2/2 + r^4 Q(r^2) on |r| <= pi/4; Q fitted to (cos r - 1 + r^2/2)/r^4, absolute:
// E = 2.5e-9, so 1e-9 on cos.
template <class V> static inline V cos_poly(V r) {
  static constexpr float c[] = {0.0416666642f, -0.0013888214f, 2.45293777e-05f};
  V s = r * r;
  return fma(s * s, poly(s, c), fma(s, splat<V>(-0.5f), splat<V>(1.0f)));
}

// Lanes with |x| above this go to libm: below it the reduction is accurate (see trig_reduce).
constexpr float kTrigFastMax = 0x1p17f;

// x = n pi/2 + r, |r| <= pi/4 (about), n = rint(2x/pi). pi/2 = C1 + C2 + C3 to 2^-76; x - n C1
// is exact (fma, Sterbenz), and the later steps round relative to r itself, so r is good to a
// few ulp of r even next to multiples of pi/2, for |n| < 2^17.
template <class V> static inline V trig_reduce(V x, ui_t<V> &n) {
  V t = x * 0.636619747f + kMagic;
  V nf = t - kMagic;
  n = bits(t) - bits(splat<V>(kMagic));
  V r = fma(nf, splat<V>(-0x1.921fb6p+0f), x);
  r = fma(nf, splat<V>(0x1.777a5cp-25f), r);
  return fma(nf, splat<V>(0x1.ee59dap-50f), r);
}

// Lanes with |x| > kTrigFastMax (inf included) recomputed by f.
template <class V, class F> static inline V trig_big(V x, V r, F f) {
  si_t<V> big = abs(x) > kTrigFastMax;
  if (__builtin_expect(any<V>(big), 0))
    for (int i = 0; i < lanes<V>; ++i)
      if (big[i]) r[i] = f(x[i]);
  return r;
}

template <class V> static inline V sin_f32(V x) {
  ui_t<V> n;
  V r = trig_reduce(x, n);
  // quadrant n: sin x = sin r, cos r, -sin r, -cos r
  V y = sel((si_t<V>)(n & 1u) != 0, cos_poly(r), sin_poly(r));
  y = from_bits<V>(bits(y) ^ ((n & 2u) << 30));
  y = sel(x == 0.0f, x, y);  // the reduction turns -0 into +0
  return trig_big(x, y, [](float v) { return std::sin(v); });
}

template <class V> static inline V cos_f32(V x) {
  ui_t<V> n;
  V r = trig_reduce(x, n);
  // quadrant n: cos x = cos r, -sin r, -cos r, sin r
  V y = sel((si_t<V>)(n & 1u) != 0, sin_poly(r), cos_poly(r));
  y = from_bits<V>(bits(y) ^ (((n + 1u) & 2u) << 30));
  return trig_big(x, y, [](float v) { return std::cos(v); });
}

template <class V> static inline V tan_f32(V x) {
  ui_t<V> n;
  V r = trig_reduce(x, n);
  V s = sin_poly(r), c = cos_poly(r);
  si_t<V> odd = (si_t<V>)(n & 1u) != 0;  // tan x = tan r, or -cot r in odd quadrants
  V y = sel(odd, -c, s) / sel(odd, s, c);
  y = sel(x == 0.0f, x, y);  // keeps -0
  return trig_big(x, y, [](float v) { return std::tan(v); });
}

// atan t = t + t^3 P(t^2) on |t| <= tan(pi/8); P fitted to (atan t - t)/t^3 in s = t^2 weighted
// by t/atan t: E = 2.0e-8, so 3.4e-9 relative on atan.
template <class V> static inline V atan_poly(V t) {
  static constexpr float c[] = {-0.333333313f, 0.199994445f, -0.142606378f, 0.107082374f, -0.0633605719f};
  V s = t * t;
  return fma(t * s, poly(s, c), t);
}

// atan(a/b) for a, b >= 0 = base + atan(t) with a single division: t = a/b when a/b <= tan(pi/8),
// t = (a - b)/(a + b) with base pi/4 up to tan(3pi/8), else t = -b/a with base pi/2. When
// `negate`, returns pi - atan(a/b) instead (atan2 with x < 0), still rounding once at the end.
template <class V> static inline V atan_core(V a, V b, si_t<V> negate) {
  si_t<V> z1 = a <= 0.414213562f * b;
  si_t<V> z3 = a > 2.41421356f * b;
  V num = sel(z1, a, sel(z3, -b, a - b));
  V den = sel(z1, b, sel(z3, a, a + b));
  V t = num / den;
  V hi = sel(z1, V{}, sel(z3, splat<V>(kPio2Hi), splat<V>(kPio4Hi)));
  V lo = sel(z1, V{}, sel(z3, splat<V>(kPio2Lo), splat<V>(kPio4Lo)));
  V p = atan_poly(t);
  // pi - (hi + lo + p): pi - 0 = pi, pi - pi/4 = 3pi/4, pi - pi/2 = pi/2
  V nhi = sel(z1, splat<V>(kPiHi), sel(z3, splat<V>(kPio2Hi), splat<V>(k3Pio4Hi)));
  V nlo = sel(z1, splat<V>(kPiLo), sel(z3, splat<V>(kPio2Lo), splat<V>(k3Pio4Lo)));
  hi = sel(negate, nhi, hi);
  lo = sel(negate, nlo, lo);
  p = sel(negate, -p, p);
  return hi + (p + lo);
}

template <class V> static inline V atan_f32(V x) {
  V y = atan_core(abs(x), splat<V>(1.0f), si_t<V>{});
  return copysign(y, x);  // NaN stays NaN through the division
}

template <class V> static inline V atan2_f32(V y, V x) {
  V a = abs(y), b = abs(x);
  // a + b must not overflow: scale both down when large (exact, or underflowing a ratio that
  // is below float resolution anyway).
  si_t<V> huge = (a > 0x1p125f) | (b > 0x1p125f);
  a = sel(huge, a * 0.25f, a);
  b = sel(huge, b * 0.25f, b);
  si_t<V> both_inf = (a == kInf) & (b == kInf);
  si_t<V> zero = a == 0.0f;  // 0/0 would be NaN: atan2(+-0, x) is 0 or pi
  V aa = sel(both_inf | zero, sel(zero, V{}, splat<V>(1.0f)), a);
  V bb = sel(both_inf | zero, splat<V>(1.0f), b);  // both inf: pi/4
  si_t<V> x_neg = (si_t<V>)(bits(x) & sign_mask<V>()) != 0;
  V r = copysign(atan_core(aa, bb, x_neg), y);
  return sel((si_t<V>)(is_nan(x) | is_nan(y)), x + y, r);
}

// asin z = z + z^3 P(z^2) on |z| <= 1/2; P fitted to (asin z - z)/z^3 in s = z^2 weighted by
// z/asin z: E = 9.9e-9, so 2.5e-9 relative on asin.
template <class V> static inline V poly_asin(V s) {
  static constexpr float c[] = {0.166666657f, 0.0750024021f, 0.0445493683f,
                                0.0316934101f, 0.014313614f,  0.0384003259f};
  return poly(s, c);
}
template <class V> static inline V asin_poly(V z, V s) { return fma(z * s, poly_asin(s), z); }

// sqrt z as s + lo for z = 0 or 2^-25 <= z <= 1/4 (z < 0 gives NaN), without libm, whose errno
// keeps it from vectorizing: a bit-level guess of y = 1/sqrt z, three Newton steps (3e-2 -> 1e-3
// -> 2e-6 -> 7e-12), s = z y corrected once by the exact fma residual z - s^2, which once more
// gives lo = (z - s^2)/(2s), the bits s lacks.
template <class V> static inline V sqrt_parts(V z0, V &lo) {
  si_t<V> zero = z0 == 0.0f;
  V z = sel(zero, splat<V>(1.0f), z0);  // 1/sqrt 0 would overflow the Newton steps
  V y = from_bits<V>(0x5f375a86u - (bits(z) >> 1));
  for (int i = 0; i < 3; ++i) y = y * fma(z * -0.5f, y * y, splat<V>(1.5f));
  V s = z * y;
  s = fma(y * 0.5f, fma(-s, s, z), s);
  lo = sel(zero, V{}, fma(-s, s, z) * (y * 0.5f));
  return sel(zero, z0, sel(z < 0.0f, splat<V>(kNaN), s));  // z < 0: |x| > 1 in asin and acos
}

// 2 asin sqrt(z) for 0 <= z <= 1/4, as head + tail: head = 2s exactly, tail the rest. The low part
// of the sqrt enters through the derivative of 2 asin, 2/sqrt(1 - z) ~ 2 + z.
template <class V> static inline V twice_asin_sqrt(V z, V &head) {
  V lo;
  V s = sqrt_parts(z, lo);
  head = s + s;
  return fma(head * z, poly_asin(z), lo * (2.0f + z));
}

template <class V> static inline V asin_f32(V x) {
  V a = abs(x);
  V small = asin_poly(a, a * a);
  // |x| > 1/2: asin a = pi/2 - 2 asin sqrt(z), z = (1 - a)/2 exactly (Sterbenz); pi/2_hi - 2s is
  // exact where it cancels (2s >= pi/4), so only the small tail rounds.
  V head, tail = twice_asin_sqrt((1.0f - a) * 0.5f, head);
  V big = (kPio2Hi - head) - (tail - kPio2Lo);
  return copysign(sel(a <= 0.5f, small, big), x);  // NaN: big is NaN
}

template <class V> static inline V acos_f32(V x) {
  V a = abs(x);
  V small = kPio2Hi - (asin_poly(x, x * x) - kPio2Lo);
  // |x| > 1/2: acos x = 2 asin sqrt((1 - |x|)/2) for x > 0, pi minus that for x < 0
  V head, tail = twice_asin_sqrt((1.0f - a) * 0.5f, head);
  V big = sel(x < 0.0f, kPiHi - (head + (tail - kPiLo)), head + tail);
  return sel(a <= 0.5f, small, big);
}

// ---------------------------------------------------------------- float32: hyperbolic, sigmoid

// tanh x = x + x^3 P(x^2) on |x| < 0.625; P fitted to (tanh x - x)/x^3 in s = x^2 weighted by
// x/tanh x: E = 1.0e-8, so 3.9e-9 relative on tanh.
template <class V> static inline V tanh_f32(V x) {
  static constexpr float c[] = {-0.333333343f, 0.133334383f, -0.0539853536f,
                                0.021948915f,  -0.00885600317f, 0.00280597596f};
  V a = abs(x);
  V s = x * x;
  V small = fma(x * s, poly(s, c), x);
  // Elsewhere tanh |x| = 1 - 2t/(1 + t) with t = e^-2|x| in (0, 0.29]: no cancellation as
  // 2t/(1 + t) < 0.45. |x| is taken at most 9, where tanh already rounds to 1: beyond, t would
  // come out denormal, and arithmetic on denormals takes a microcode assist on x86 (GPT-2's GELU
  // inside a GEMM ran 10x slower on large values).
  V t = exp_nonpositive_f32(-2.0f * sel(a > 9.0f, splat<V>(9.0f), a));
  V big = copysign(1.0f - (t + t) / (1.0f + t), x);
  return sel(x == 0.0f, x, sel(a < 0.625f, small, big));  // keeps -0
}

template <class V> static inline V sigmoid_f32(V x) {
  // e = e^-|x| never overflows; 1/(1 + e) for x >= 0, e/(1 + e) for x < 0 keeps the tiny results
  // of very negative x (down to denormals) instead of 1/(1 + inf) = 0.
  V e = exp_nonpositive_f32(-abs(x));
  return sel(x >= 0.0f, splat<V>(1.0f), e) / (1.0f + e);
}

template <class V> static inline V sinh_f32(V x) {
  V a = abs(x);
  // |x| < 9: sinh = (t + t/(t + 1))/2 with t = expm1|x| (= (e^x - e^-x)/2; no cancellation, so
  // relative accuracy down to 0). Beyond, e^-|x| is below float resolution: sinh = e^|x|/2.
  V t = expm1_f32(a);
  V small = 0.5f * (t + t / (t + 1.0f));
  V big = exp_core(clamp(a, 0.0f, 90.0f), 1);
  return copysign(sel(a < 9.0f, small, big), x);
}

template <class V> static inline V cosh_f32(V x) {
  V h = exp_core(clamp(abs(x), 0.0f, 90.0f), 1);  // e^|x|/2, finite up to cosh's own overflow
  return h + 0.25f / h;
}

// ---------------------------------------------------------------- float32: erf, erfc

// erf x = x (2/sqrt(pi) + s Q(s)), s = x^2, on |x| <= 1, with 2/sqrt(pi) split hi + lo (its
// rounding alone would cost 5e-8); Q fitted to (erf(x)/x - 2/sqrt(pi))/s weighted by x/erf(x):
// E = 9e-9 relative on erf.
template <class V> static inline V erf_small(V x) {
  static constexpr float c[] = {-0.376126379f, 0.11283727f, -0.0268594287f,
                                0.00519786589f, -0.000808161567f, 8.04515075e-05f};
  V s = x * x;
  return fma(x, splat<V>(0x1.20dd76p+0f), x * fma(s, poly(s, c), splat<V>(-5.86353834e-08f)));
}

// erfc x for 0.5 <= x <= 10.5 as e^(-x^2) t S(t), t = 2/(2 + x) (t S(t) = e^(x^2) erfc x is smooth
// in t on [0.16, 0.8]); S fitted relative: E = 9.7e-9. Two errors that would each cost about an
// ulp are corrected to first order, as one relative factor 1 + corr:
//   x^2 = hi + lo exactly (fma), and e^(-x^2) = e^-hi (1 - lo) since |lo| < 4e-6;
//   the computed t0 is t (1 - dt) with dt = (r - t0 dl)/2, from d + dl = 2 + x exactly
//   (two-sum) and the exact division residual r = 2 - t0 d; t S(t) then moves by the factor
//   1 + dt (1 + t S'/S), and 1 + t S'/S = 0.938 + 1.459 t within 0.025 (least squares).
template <class V> static inline V erfc_tail(V x) {
  static constexpr float c[] = {0.282077581f, 0.282550812f, 0.241678461f, 0.208856553f, -0.0421553738f,
                                0.301227778f, -0.50696969f,  0.293188125f, -0.0604419932f};
  V d = 2.0f + x;
  V dl = sel(x <= 2.0f, (2.0f - d) + x, (x - d) + 2.0f);
  V t = 2.0f / d;
  V r = fma(-t, d, splat<V>(2.0f));
  V hi = x * x;
  V lo = fma(x, x, -hi);
  V corr = fma((r - t * dl) * 0.5f, fma(t, splat<V>(1.459f), splat<V>(0.938f)), -lo);
  V ts = t * poly(t, c);
  // e^-hi = 2^n (1 + q) as in exp_core, with (1 + q)(1 + corr) ts formed in one fma. Below -104
  // the result underflows to 0 anyway.
  ui_t<V> n;
  V q = expm1_poly(exp_reduce(clamp(-hi, -104.0f, 0.0f), n));
  V m = fma(ts, fma(corr, q + 1.0f, q), ts);
  ui_t<V> h = (ui_t<V>)((si_t<V>)n >> 1);
  return (m * pow2i<V>(h)) * pow2i<V>(n - h);
}

// erf x = x P(s)/Q(s), s = x^2, for |x| <= 4 (beyond, erf rounds to 1): one rational over the
// whole range, with no exp and no second branch to compute and select (GELU's cost is mostly its
// erf). P of degree 6 and Q of degree 5, Q(0) = 1, fitted relative on [0, 4] by reweighted linear
// least squares (Loeb's linearization with Lawson's weights, numpy, float64): E = 2e-9 with exact
// coefficients, 5e-8 with float ones; float evaluation stays within 5 ulp (3e-7 relative) near 1.
template <class V> static inline V erf_f32(V x) {
  static constexpr float p[] = {1.12837923f, 0.185204089f, 0.0543168001f, 0.00384961674f, 0.00037959966f,
                                4.68451526e-06f, -1.32009541e-08f};
  static constexpr float q[] = {1.0f, 0.497466266f, 0.113958575f, 0.0154620688f, 0.00130755838f, 6.31080766e-05f};
  V a = clamp(abs(x), 0.0f, 4.0f);
  V s = a * a;
  V r = a * (poly(s, p) / poly(s, q));
  return copysign(sel(r > 1.0f, splat<V>(1.0f), r), x);  // NaN stays NaN; keeps -0
}

template <class V> static inline V erfc_f32(V x) {
  V a = abs(x);
  V t = erfc_tail(clamp(a, 0.0f, 10.5f));  // erfc(10.5) underflows to 0
  V big = sel(x < 0.0f, 2.0f - t, t);
  return sel(a < 0.5f, 1.0f - erf_small(x), big);
}

// ---------------------------------------------------------------- float32: pow

// |x|^y = 2^(y log2|x|) in double: log2 from the mantissa split and
// log(m) = 2 atanh(s) = 2 (s + s^3/3 + ... + s^17/17), s = (m - 1)/(m + 1), |s| <= 0.172 (series
// remainder < 1e-15); 2^r on |r| <= 1/2 by the Taylor series of e^(r ln2) to degree 11
// (remainder < 1e-14). y log2|x| is then good to about 1e-13 absolute where the result is a
// finite float, so the float result is within 0.5 ulp plus 1e-12 relative. Special cases follow
// C's pow, as std::pow does.
template <class V>
struct wide {  // double vectors with V's lane count
  typedef double D __attribute__((vector_size(lanes<V> * sizeof(double))));
  typedef int64_t L __attribute__((vector_size(lanes<V> * sizeof(double))));
  typedef uint64_t UL __attribute__((vector_size(lanes<V> * sizeof(double))));
};

template <class V> static inline V pow_f32(V x, V y) {
  using D = typename wide<V>::D;
  using L = typename wide<V>::L;
  using UL = typename wide<V>::UL;
  D ax = __builtin_convertvector(abs(x), D);  // float denormals are normal doubles
  UL d = (UL)ax - 0x3fe6a09e667f3bcdull;       // bits of sqrt(1/2)
  L k = (L)d >> 52;
  D m = (D)((UL)ax - ((UL)k << 52));
  D s = (m - 1.0) / (m + 1.0), s2 = s * s;
  static constexpr double c_log[] = {1.0,      1.0 / 3,  1.0 / 5,  1.0 / 7, 1.0 / 9,
                                     1.0 / 11, 1.0 / 13, 1.0 / 15, 1.0 / 17};
  D lnm = D{} + c_log[8];
#pragma GCC unroll 16
  for (int j = 7; j >= 0; --j) lnm = lnm * s2 + c_log[j];
  D lg = __builtin_convertvector(k, D) + (2.0 * s * lnm) * 1.4426950408889634;
  lg = ax == 0.0 ? D{} - (double)kInf : lg;
  lg = (ax == (double)kInf) | (ax != ax) ? ax : lg;  // the bit split loses inf and NaN
  D z = __builtin_convertvector(y, D) * lg;
  z = z > 300.0 ? D{} + 300.0 : z;  // beyond +-300 the float result is inf or 0 anyway
  z = z < -300.0 ? D{} - 300.0 : z;
  D t = z + 0x1.8p52;  // rint for doubles
  D nf = t - 0x1.8p52;
  D r = (z - nf) * 0.6931471805599453;
  static constexpr double c_exp[] = {1.0,           1.0,            1.0 / 2,        1.0 / 6,
                                     1.0 / 24,      1.0 / 120,      1.0 / 720,      1.0 / 5040,
                                     1.0 / 40320,   1.0 / 362880,   1.0 / 3628800,  1.0 / 39916800};
  D e = D{} + c_exp[11];
#pragma GCC unroll 16
  for (int j = 10; j >= 0; --j) e = e * r + c_exp[j];
  UL nb = (UL)t - (UL)(D{} + 0x1.8p52);
  D p = e * (D)((nb + 1023u) << 52);
  V res = __builtin_convertvector(p, V);

  V yi = rint(y);
  si_t<V> y_int = yi == y;  // inf counts as an (even) integer
  V yh = y * 0.5f;
  si_t<V> y_odd = y_int & (rint(yh) != yh);
  si_t<V> x_neg = (si_t<V>)(bits(x) & sign_mask<V>()) != 0;
  res = sel(x_neg & y_odd, -res, res);                                      // (-2)^3, (-0)^-1
  res = sel((x < 0.0f) & (x > -kInf) & ~y_int, splat<V>(kNaN), res);        // (-2)^0.5
  res = sel((x == -1.0f) & (abs(y) == kInf), splat<V>(1.0f), res);          // (-1)^inf
  return sel((x == 1.0f) | (y == 0.0f), splat<V>(1.0f), res);              // 1^nan, nan^0
}

}  // namespace kiln_vm

// ---------------------------------------------------------------- public functions

#define KILN_VM_ELEM(x) std::remove_cv_t<std::remove_reference_t<decltype(x[0])>>
#define KILN_VM_FLOAT_ONLY(T) \
  static_assert(std::is_floating_point_v<T>, "kiln vector math: this function needs float or double lanes")

// float32 lanes: the vector algorithm; float64: a lane loop over the std:: function. (Each
// function is spelled out, `kiln_v<op>(`, as codegen/cpp/body.py finds the ops it can call here.)
#define KILN_VM_DISPATCH(x, f32, stdfn)                                  \
  using T = KILN_VM_ELEM(x);                                            \
  KILN_VM_FLOAT_ONLY(T);                                                \
  if constexpr (std::is_same_v<T, float>) return kiln_vm::f32(x);      \
  else return kiln_vm::map(x, [](T v) { return stdfn(v); })

template <class V> static inline V kiln_vexp(V x) { KILN_VM_DISPATCH(x, exp_f32, std::exp); }
template <class V> static inline V kiln_vexpm1(V x) { KILN_VM_DISPATCH(x, expm1_f32, std::expm1); }
template <class V> static inline V kiln_vlog(V x) { KILN_VM_DISPATCH(x, log_f32, std::log); }
template <class V> static inline V kiln_vlog1p(V x) { KILN_VM_DISPATCH(x, log1p_f32, std::log1p); }
template <class V> static inline V kiln_vsin(V x) { KILN_VM_DISPATCH(x, sin_f32, std::sin); }
template <class V> static inline V kiln_vcos(V x) { KILN_VM_DISPATCH(x, cos_f32, std::cos); }
template <class V> static inline V kiln_vtan(V x) { KILN_VM_DISPATCH(x, tan_f32, std::tan); }
template <class V> static inline V kiln_vtanh(V x) { KILN_VM_DISPATCH(x, tanh_f32, std::tanh); }
template <class V> static inline V kiln_verf(V x) { KILN_VM_DISPATCH(x, erf_f32, std::erf); }
template <class V> static inline V kiln_verfc(V x) { KILN_VM_DISPATCH(x, erfc_f32, std::erfc); }
template <class V> static inline V kiln_vatan(V x) { KILN_VM_DISPATCH(x, atan_f32, std::atan); }
template <class V> static inline V kiln_vasin(V x) { KILN_VM_DISPATCH(x, asin_f32, std::asin); }
template <class V> static inline V kiln_vacos(V x) { KILN_VM_DISPATCH(x, acos_f32, std::acos); }
template <class V> static inline V kiln_vsinh(V x) { KILN_VM_DISPATCH(x, sinh_f32, std::sinh); }
template <class V> static inline V kiln_vcosh(V x) { KILN_VM_DISPATCH(x, cosh_f32, std::cosh); }
#undef KILN_VM_DISPATCH

template <class V> static inline V kiln_vsigmoid(V x) {
  using T = KILN_VM_ELEM(x);
  KILN_VM_FLOAT_ONLY(T);
  if constexpr (std::is_same_v<T, float>) {
    return kiln_vm::sigmoid_f32(x);
  } else {
    V e = kiln_vm::map(-kiln_vm::abs(x), [](T v) { return std::exp(v); });
    return kiln_vm::sel(x >= 0, kiln_vm::splat<V>(1), e) / (1 + e);
  }
}

template <class V> static inline V kiln_vpow(V x, V y) {
  using T = KILN_VM_ELEM(x);
  KILN_VM_FLOAT_ONLY(T);
  if constexpr (std::is_same_v<T, float>) return kiln_vm::pow_f32(x, y);
  else return kiln_vm::map2(x, y, [](T a, T b) { return std::pow(a, b); });
}

template <class V> static inline V kiln_vatan2(V y, V x) {
  using T = KILN_VM_ELEM(x);
  KILN_VM_FLOAT_ONLY(T);
  if constexpr (std::is_same_v<T, float>) return kiln_vm::atan2_f32(y, x);
  else return kiln_vm::map2(y, x, [](T a, T b) { return std::atan2(a, b); });
}

// Exact (correctly rounded) for every type; see the top of the file about vectorization.
template <class V> static inline V kiln_vsqrt(V x) {
  using T = KILN_VM_ELEM(x);
  KILN_VM_FLOAT_ONLY(T);
  return kiln_vm::map(x, [](T v) { return std::sqrt(v); });
}

// As eager: 1/sqrt(x), so rsqrt(0) = inf, rsqrt(-0) = -inf.
template <class V> static inline V kiln_vrsqrt(V x) { return 1 / kiln_vsqrt(x); }

template <class V> static inline V kiln_vreciprocal(V x) {
  KILN_VM_FLOAT_ONLY(KILN_VM_ELEM(x));
  return 1 / x;
}

// A lane loop over std::lgamma for every type (not vectorized): libm's lgammaf is within a few ulp
// of eager's float32 lgamma, though not bit-equal to it. (libm's lgamma also writes the global
// signgam, a harmless race under OpenMP.)
template <class V> static inline V kiln_vlgamma(V x) {
  using T = KILN_VM_ELEM(x);
  KILN_VM_FLOAT_ONLY(T);
  return kiln_vm::map(x, [](T v) { return std::lgamma(v); });
}

// ---------------------------------------------------------------- any element type

template <class V> static inline V kiln_vabs(V x) {
  using T = KILN_VM_ELEM(x);
  if constexpr (std::is_floating_point_v<T>) return kiln_vm::abs(x);  // clears the sign: -0 -> 0
  else if constexpr (std::is_signed_v<T>) return x < 0 ? -x : x;
  else return x;
}

// round() is half to even, like torch.round; floor/ceil/trunc are built on it (vectorized, unlike
// std::floor under -ftrapping-math) and take the sign of x, so that floor(-0.0) = -0 and
// ceil(-0.5) = -0 as in libm. Integer lanes are returned unchanged.
template <class V> static inline V kiln_vround(V x) {
  if constexpr (std::is_floating_point_v<KILN_VM_ELEM(x)>) return kiln_vm::rint(x);
  else return x;
}
template <class V> static inline V kiln_vfloor(V x) {
  if constexpr (std::is_floating_point_v<KILN_VM_ELEM(x)>) {
    V r = kiln_vm::rint(x);
    return kiln_vm::copysign(kiln_vm::sel(r > x, r - 1, r), x);
  } else {
    return x;
  }
}
template <class V> static inline V kiln_vceil(V x) {
  if constexpr (std::is_floating_point_v<KILN_VM_ELEM(x)>) {
    V r = kiln_vm::rint(x);
    return kiln_vm::copysign(kiln_vm::sel(r < x, r + 1, r), x);
  } else {
    return x;
  }
}
template <class V> static inline V kiln_vtrunc(V x) {
  if constexpr (std::is_floating_point_v<KILN_VM_ELEM(x)>) {
    V a = kiln_vm::abs(x);
    V r = kiln_vm::rint(a);
    return kiln_vm::copysign(kiln_vm::sel(r > a, r - 1, r), x);
  } else {
    return x;
  }
}

// torch.sign: -1, 0 or 1, and 0 for both zeros and for NaN (eager computes (0 < x) - (x < 0)).
template <class V> static inline V kiln_vsign(V x) {
  using T = KILN_VM_ELEM(x);
  return kiln_vm::sel(x > 0, V{} + T(1), V{}) - kiln_vm::sel(x < 0, V{} + T(1), V{});
}

// torch.maximum / torch.minimum: NaN if either is NaN; on ties (+-0) the second operand, as
// eager's vectorized path gives.
template <class V> static inline V kiln_vmaximum(V a, V b) {
  V r = a > b ? a : b;
  if constexpr (std::is_floating_point_v<KILN_VM_ELEM(a)>) r = kiln_vm::sel(a != a, a, kiln_vm::sel(b != b, b, r));
  return r;
}
template <class V> static inline V kiln_vminimum(V a, V b) {
  V r = a < b ? a : b;
  if constexpr (std::is_floating_point_v<KILN_VM_ELEM(a)>) r = kiln_vm::sel(a != a, a, kiln_vm::sel(b != b, b, r));
  return r;
}

#undef KILN_VM_FLOAT_ONLY
#undef KILN_VM_ELEM

#endif  // KILN_VEC_MATH_H
