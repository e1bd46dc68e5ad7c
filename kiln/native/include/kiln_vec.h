// kiln's portable SIMD layer: GCC vector extensions, one code path for AVX-512, AVX2, NEON and SSE.
//
// Every vector in a kernel has the same lane count L (one register of float32), whatever its
// element type, so __builtin_convertvector converts between any two of them. Booleans are a
// distinct type, `mask` (lanes of int32, true = -1), so templates never confuse a comparison
// result with an int32 tensor value.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#define KILN_VEC_BYTES 64
#elif defined(__AVX__)
#define KILN_VEC_BYTES 32
#else
#define KILN_VEC_BYTES 16
#endif

// g++ before 13 knows _Float16 in C++ on x86 only; kiln_half.h (included after this file) needs
// just its conversions to and from float, which ARM's IEEE __fp16 makes the same way (round to
// nearest even, in one instruction).
#if defined(__aarch64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
typedef __fp16 _Float16;
#endif

namespace kiln {
constexpr int L = KILN_VEC_BYTES / 4;

template <typename T> struct vec_of { typedef T type __attribute__((vector_size(L * sizeof(T)))); };
template <typename T> using vec = typename vec_of<T>::type;
template <typename V> using elem_t = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<V>()[0])>>;
template <int Bytes> struct int_of;
template <> struct int_of<1> { using type = int8_t; };
template <> struct int_of<2> { using type = int16_t; };
template <> struct int_of<4> { using type = int32_t; };
template <> struct int_of<8> { using type = int64_t; };

struct mask { vec<int32_t> m; };
template <typename V> static inline mask to_mask(V comparison) { return {__builtin_convertvector(comparison, vec<int32_t>)}; }
static inline mask operator&&(mask a, mask b) { return {a.m & b.m}; }
static inline mask operator||(mask a, mask b) { return {a.m | b.m}; }
static inline mask operator!(mask a) { return {~a.m}; }
static inline mask operator==(mask a, mask b) { return {a.m == b.m}; }
static inline mask operator!=(mask a, mask b) { return {a.m != b.m}; }
// Arithmetic on bools, as eager's bool tensors: product is and, sum is or.
static inline mask operator*(mask a, mask b) { return {a.m & b.m}; }
static inline mask operator+(mask a, mask b) { return {a.m | b.m}; }

// Vectors of 64-bit lanes span two registers. GCC (12) compares and selects such a vector lane by
// lane in scalar code, about a hundred instructions for 16 x int64 on AVX-512 (a rotary
// embedding's `index < 32` cost 8x the kernel's memory time); these helpers work on the two
// register-wide halves instead, each one instruction or two.
template <typename V> constexpr bool wide = sizeof(V) > KILN_VEC_BYTES;
template <typename V> struct half_of { typedef elem_t<V> type __attribute__((vector_size(sizeof(V) / 2))); };
template <typename V> using half_t = typename half_of<V>::type;
typedef int32_t half_mask_t __attribute__((vector_size(KILN_VEC_BYTES / 2)));
template <typename H, typename V> static inline H part(const V& v, int k) { H h; std::memcpy(&h, reinterpret_cast<const char*>(&v) + k * sizeof(H), sizeof(H)); return h; }
template <typename V, typename H> static inline V join(H low, H high) {
  V v;
  std::memcpy(&v, &low, sizeof(H));
  std::memcpy(reinterpret_cast<char*>(&v) + sizeof(H), &high, sizeof(H));
  return v;
}
// A comparison's mask, `cmp` applied to whole vectors or, for wide ones, to each half.
template <typename V, typename C> static inline mask compare(V a, V b, C cmp) {
  if constexpr (wide<V>) {
    using H = half_t<V>;
    return {join<vec<int32_t>>(__builtin_convertvector(cmp(part<H>(a, 0), part<H>(b, 0)), half_mask_t),
                               __builtin_convertvector(cmp(part<H>(a, 1), part<H>(b, 1)), half_mask_t))};
  } else {
    return to_mask(cmp(a, b));
  }
}
template <typename V> static inline mask veq(V a, V b) { return compare(a, b, [](auto x, auto y) { return x == y; }); }
template <typename V> static inline mask vne(V a, V b) { return compare(a, b, [](auto x, auto y) { return x != y; }); }
template <typename V> static inline mask vlt(V a, V b) { return compare(a, b, [](auto x, auto y) { return x < y; }); }
template <typename V> static inline mask vle(V a, V b) { return compare(a, b, [](auto x, auto y) { return x <= y; }); }
template <typename V> static inline mask vgt(V a, V b) { return compare(a, b, [](auto x, auto y) { return x > y; }); }
template <typename V> static inline mask vge(V a, V b) { return compare(a, b, [](auto x, auto y) { return x >= y; }); }
static inline mask veq(mask a, mask b) { return a == b; }
static inline mask vne(mask a, mask b) { return a != b; }

// s - 0, not 0 + s: the latter turns -0.0 into +0.0.
template <typename T> static inline vec<T> splat(T s) { return s - vec<T>{}; }
static inline mask splat_mask(bool b) { return {vec<int32_t>{} - int32_t(b)}; }
// A vector of type V (a vec or a mask) with `s` in every lane.
template <typename V, typename S> static inline V splat_as(S s) {
  if constexpr (std::is_same_v<V, mask>) return splat_mask(bool(s));
  else return splat<elem_t<V>>(static_cast<elem_t<V>>(s));
}

template <typename V> static inline V select(mask c, V a, V b) {
  using I = typename int_of<sizeof(elem_t<V>)>::type;
  if constexpr (wide<V>) {
    using H = half_t<V>;
    typedef I HI __attribute__((vector_size(sizeof(H))));
    return join<V>(__builtin_convertvector(part<half_mask_t>(c.m, 0), HI) ? part<H>(a, 0) : part<H>(b, 0),
                   __builtin_convertvector(part<half_mask_t>(c.m, 1), HI) ? part<H>(a, 1) : part<H>(b, 1));
  } else {
    return __builtin_convertvector(c.m, vec<I>) ? a : b;
  }
}
static inline mask select(mask c, mask a, mask b) { return {c.m ? a.m : b.m}; }

// Conversions: to a number type lane by lane (true -> 1), or to bool (nonzero -> true).
template <typename T, typename V> static inline vec<T> convert(V v) { return __builtin_convertvector(v, vec<T>); }
template <typename T> static inline vec<T> convert(mask v) { return __builtin_convertvector(v.m & 1, vec<T>); }
template <typename V> static inline mask to_bool(V v) { return vne(v, V{}); }
static inline mask to_bool(mask v) { return v; }

template <typename T> static inline vec<T> load(const T* p) { vec<T> v; std::memcpy(&v, p, sizeof(v)); return v; }
static inline mask load_mask(const bool* p) {
  vec<int8_t> b; std::memcpy(&b, p, sizeof(b));
  return {-__builtin_convertvector(b, vec<int32_t>)};
}
template <typename T> static inline void store(T* p, vec<T> v) { std::memcpy(p, &v, sizeof(v)); }
// A store that does not bring p's line into the caches (a non-temporal store: no read of the line
// before it is written), p aligned to a whole vector; a plain store where the ISA has none here.
static inline void store_stream(float* p, vec<float> v) {
#if defined(__AVX512F__)
  __builtin_ia32_movntps512(p, v);
#elif defined(__AVX__)
  __builtin_ia32_movntps256(p, v);
#elif defined(__SSE__)
  __builtin_ia32_movntps(p, v);
#else
  store(p, v);
#endif
}
// Orders this thread's streaming stores before its later stores (a barrier's flag): other threads
// that see the flag see the data.
static inline void store_stream_fence() {
#if defined(__SSE__)
  __builtin_ia32_sfence();
#endif
}
static inline void store(bool* p, mask v) { vec<int8_t> b = __builtin_convertvector(v.m & 1, vec<int8_t>); std::memcpy(p, &b, sizeof(b)); }

// Lanes computed one by one (gathers, strided and indirect loads, index expressions).
template <typename T, typename F> static inline vec<T> lanes(F f) { vec<T> v; for (int l = 0; l < L; ++l) v[l] = f(l); return v; }
template <typename F> static inline mask lanes_mask(F f) { mask v; for (int l = 0; l < L; ++l) v.m[l] = f(l) ? -1 : 0; return v; }
template <typename T> static inline vec<T> iota(T base, T step) { vec<T> v; for (int l = 0; l < L; ++l) v[l] = base + step * T(l); return v; }
template <typename V, typename F> static inline void scatter(V v, F at) { for (int l = 0; l < L; ++l) *at(l) = v[l]; }
template <typename F> static inline void scatter(mask v, F at) { for (int l = 0; l < L; ++l) *at(l) = v.m[l] != 0; }
// Lane-wise application of a scalar expression: ops without a vector algorithm.
template <typename V, typename F> static inline auto map(F f, V a) {
  using R = decltype(f(a[0]));
  if constexpr (std::is_same_v<R, bool>) return lanes_mask([&](int l) { return f(a[l]); });
  else return lanes<R>([&](int l) { return f(a[l]); });
}
template <typename F> static inline auto map(F f, mask a) {
  using R = decltype(f(true));
  if constexpr (std::is_same_v<R, bool>) return lanes_mask([&](int l) { return f(a.m[l] != 0); });
  else return lanes<R>([&](int l) { return f(a.m[l] != 0); });
}
template <typename V> static inline auto lane(V v, int l) { return v[l]; }
static inline bool lane(mask v, int l) { return v.m[l] != 0; }
template <typename A, typename B, typename F> static inline auto map2(F f, A a, B b) {
  using R = decltype(f(lane(a, 0), lane(b, 0)));
  if constexpr (std::is_same_v<R, bool>) return lanes_mask([&](int l) { return f(lane(a, l), lane(b, l)); });
  else return lanes<R>([&](int l) { return f(lane(a, l), lane(b, l)); });
}

// NaN-propagating max/min, as torch.maximum and eager's max reductions.
template <typename V> static inline V vmax(V a, V b) {
  if constexpr (wide<V>) { using H = half_t<V>; return join<V>(vmax(part<H>(a, 0), part<H>(b, 0)), vmax(part<H>(a, 1), part<H>(b, 1))); }
  else { V r = a > b ? a : b; r = b != b ? b : r; return a != a ? a : r; }
}
template <typename V> static inline V vmin(V a, V b) {
  if constexpr (wide<V>) { using H = half_t<V>; return join<V>(vmin(part<H>(a, 0), part<H>(b, 0)), vmin(part<H>(a, 1), part<H>(b, 1))); }
  else { V r = a < b ? a : b; r = b != b ? b : r; return a != a ? a : r; }
}
// Bools order false < true, the reverse of a mask's lanes as integers (true is -1).
static inline mask vlt(mask a, mask b) { return {~a.m & b.m}; }
static inline mask vle(mask a, mask b) { return {~a.m | b.m}; }
static inline mask vgt(mask a, mask b) { return {a.m & ~b.m}; }
static inline mask vge(mask a, mask b) { return {a.m | ~b.m}; }
static inline mask vmax(mask a, mask b) { return a || b; }
static inline mask vmin(mask a, mask b) { return a && b; }
template <typename V> static inline V vrelu(V a) {
  if constexpr (wide<V>) { using H = half_t<V>; return join<V>(vrelu(part<H>(a, 0)), vrelu(part<H>(a, 1))); }
  else return a < 0 ? V{} : a;
}

template <typename V> static inline auto hsum(V v) { elem_t<V> s = 0; for (int l = 0; l < L; ++l) s += v[l]; return s; }
template <typename V> static inline auto hprod(V v) { elem_t<V> s = 1; for (int l = 0; l < L; ++l) s *= v[l]; return s; }
template <typename V> static inline auto hmax(V v) { auto s = v[0]; for (int l = 1; l < L; ++l) s = kiln_max(s, v[l]); return s; }
template <typename V> static inline auto hmin(V v) { auto s = v[0]; for (int l = 1; l < L; ++l) s = kiln_min(s, v[l]); return s; }
static inline bool hany(mask v) { for (int l = 0; l < L; ++l) if (v.m[l]) return true; return false; }
static inline bool hall(mask v) { for (int l = 0; l < L; ++l) if (!v.m[l]) return false; return true; }
static inline bool hmax(mask v) { return hany(v); }  // max and min of bools: any and all
static inline bool hmin(mask v) { return hall(v); }

// Indirect indexing lane by lane; out-of-range lanes are clamped and flagged as in scalar code.
template <typename V> static inline vec<int64_t> vindex(V v, int64_t size) {
  return lanes<int64_t>([&](int l) { return kiln_index(static_cast<int64_t>(v[l]), size); });
}
}  // namespace kiln
