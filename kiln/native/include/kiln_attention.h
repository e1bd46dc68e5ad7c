// kiln's own attention for inference: out = softmax(q · kᵀ · scale + mask) · v in float32, every
// batch and head in one call. q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv] and out
// [B, H, Sq, Dv] each have their own strides with rows of unit stride; the additive mask is
// broadcast to [B, H, Sq, Sk] by zero strides; `causal`: query i sees keys 0..i (ATen's is_causal).
//
// Once a call, each query row's end: after its own key (causal) and after the last key its mask
// leaves above -inf (a causal mask written out as 0 and -inf); keys past a row's end are never
// computed, and a mask that is zero before every row's end is not added.
// A task is one head's range of query rows; each thread runs its tasks with buffers of its own.
// An attention of at most FEW_ROWS query rows (a decode step's) reads the keys where they lie:
// each row's scores are dot products with L keys at a time, its softmax, then P · v key by key.
// Otherwise, each task:
//   1. kᵀ packed into panels [ceil(keys / NR)][D][NR] (the GEMM's layout: kiln_gemm.h), once
//      per task: a transpose of the head's keys, the only copy of an operand;
//   2. for each block of QB query rows: S = q · kᵀ, register tiles of MR rows x NR keys (q's values
//      broadcast where they lie), scaled, masked and cut at each row's end in the tile's store,
//      which also raises each row's running maximum, into a row-major buffer of QB x Sk that stays
//      in L1/L2;
//   3. each row exponentiated against its maximum in one pass, its sum's inverse kept;
//   4. out = P · v, register tiles of MR_O rows x NV_O vectors of v (read where it lies), each
//      row multiplied by its inverse sum in the store.
// Whole rows of scores are held (no running rescale as in flash attention): at the lengths a CPU
// runs in inference the block of rows fits the caches (QB x Sk floats per thread). A task computes
// only the tiles before its rows' ends (at or below a causal diagonal). A row whose every score is
// -inf (fully masked) is zeros, as ATen's CPU flash kernel makes it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <omp.h>
#include <type_traits>
#include <utility>
#include <vector>

namespace kiln_attention {
using kiln::L;
using V = kiln::vec<float>;

// S tiles: the GEMM's register blocking. P · v tiles: v's rows are Dv wide (64 in most models), so
// wider tiles of fewer rows: 6 x 4 vectors where the register file has 32 (AVX-512, NEON), 6 x 2
// where it has 16.
constexpr int MR_S = kiln_gemm::MR, NV_S = kiln_gemm::NV, NR_S = NV_S * L;
constexpr int MR_O = 6, NV_O = kiln_gemm::NV >= 3 ? 4 : 2;
// Query rows per block of scores: QB x Sk floats (48 x 197 x 4 = 38 KB for ViT-base) stay in L1/L2.
constexpr int64_t QB = 48;

struct Shape {
  int64_t B, H, Sq, Sk, D, Dv;
  int64_t q_b, q_h, q_s, k_b, k_h, k_s, v_b, v_h, v_s, o_b, o_h, o_s;  // element strides
  int64_t m_b, m_h, m_q;  // the mask's (0 along a broadcast dimension); its rows of unit stride
};

// acc += A [R rows, kc] @ B [kc, NVX vectors], A's rows lda apart (its values broadcast), B's
// rows ldb apart.
template <int R, int NVX>
static inline void micro(V (&acc)[R][NVX], int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb) {
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NVX];
#pragma GCC unroll 8
    for (int v = 0; v < NVX; ++v) bv[v] = kiln::load(b + k * ldb + v * L);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      V ar = kiln_gemm::broadcast(a + r * lda + k);
#pragma GCC unroll 8
      for (int v = 0; v < NVX; ++v) acc[r][v] = kiln_gemm::fma(ar, bv[v], acc[r][v]);
    }
  }
}

// rows x NVX vectors of A @ B, each row times row_scale[r] (or 1), stored at c (rows ldc apart).
template <int R, int NVX>
static inline void tile(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                        const float* row_scale) {
  V acc[R][NVX];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NVX; ++v) acc[r][v] = V{};
  micro<R, NVX>(acc, kc, a, lda, b, ldb);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NVX; ++v) kiln::store(c + r * ldc + v * L, row_scale ? acc[r][v] * row_scale[r] : acc[r][v]);
}

// f(R, NVX) with R = `rows` (<= MAX) and NVX = `nv` (<= NVMAX) as compile-time constants
// (std::integral_constant): a tile instantiated for exactly the ragged edge's size.
template <int MAX, int NVMAX, int R = MAX, typename F>
static inline void sized(int rows, int nv, F&& f) {
  if constexpr (R > 1) {
    if (rows < R) return sized<MAX, NVMAX, R - 1>(rows, nv, f);
  }
  using RC = std::integral_constant<int, R>;
  if constexpr (NVMAX >= 4) if (nv == 4) return f(RC{}, std::integral_constant<int, 4>{});
  if constexpr (NVMAX >= 3) if (nv == 3) return f(RC{}, std::integral_constant<int, 3>{});
  if constexpr (NVMAX >= 2) if (nv == 2) return f(RC{}, std::integral_constant<int, 2>{});
  f(RC{}, std::integral_constant<int, 1>{});
}

// What a tile of scores does before its store: scale, add the mask's row (mask + r * m_q, or
// none), set -inf past each row's end (row_end; always past Sk),
// and raise each row's running maximum (a vector per row: one horizontal max per row, later).
struct ScoreStore {
  float scale;
  const float* mask;  // at the tile's first row and key
  int64_t m_q;
  int64_t j0;  // the tile's first key
  const int64_t* row_end;  // each row's end (keys from there are -inf), at the tile's first row
  V* row_max;  // at the tile's first row
};

template <int R, int NVX>
static inline void score_tile(int64_t D, const float* a, int64_t lda, const float* b, float* c, int64_t ldc,
                              const ScoreStore& st) {
  V acc[R][NVX];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NVX; ++v) acc[r][v] = V{};
  micro<R, NVX>(acc, D, a, lda, b, NR_S);
  const V minus_inf = V{} - std::numeric_limits<float>::infinity();
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const int64_t end = st.row_end[r];
    V m = st.row_max[r];
#pragma GCC unroll 8
    for (int v = 0; v < NVX; ++v) {
      const int64_t j = st.j0 + v * L;
      const int n = int(std::max<int64_t>(0, std::min<int64_t>(L, end - j)));
      V x = acc[r][v] * st.scale;
      if (n == L) {
        if (st.mask) x += kiln::load(st.mask + r * st.m_q + v * L);
      } else {
        if (st.mask) x += kiln_gemm::load_n(st.mask + r * st.m_q + v * L, false, n);
        x = kiln::select(kiln::vlt(kiln::iota<int32_t>(0, 1), kiln::splat<int32_t>(n)), x, minus_inf);
      }
      kiln::store(c + r * ldc + v * L, x);
      m = x > m ? x : m;
    }
    st.row_max[r] = m;
  }
}

// The L x L block at rows r[0..L) transposed in registers: log2(L) rounds, each exchanging the
// off-diagonal blocks of width w between rows i and i + w (two-source shuffles: vpermt2ps).
template <int W, size_t... I>
static inline void exchange(V& a, V& b, std::index_sequence<I...>) {
  V lo = __builtin_shufflevector(a, b, ((I & W) ? L + I - W : I)...);
  V hi = __builtin_shufflevector(a, b, ((I & W) ? L + I : I + W)...);
  a = lo, b = hi;
}
template <int W = 1>
static inline void transpose(V (&r)[L]) {
  if constexpr (W < L) {
#pragma GCC unroll 16
    for (int i = 0; i < L; ++i)
      if (!(i & W)) exchange<W>(r[i], r[i + W], std::make_index_sequence<L>{});
    transpose<W * 2>(r);
  }
}

// A decode step's KV cache comes from memory (the step's weights have passed through the caches
// since the layer last read it), and a head's keys cross a 4 KB page every 16 rows of 64 floats,
// where the hardware's prefetcher stops: each block of keys waited for memory. So the keys are
// asked for KEYS_AHEAD rows ahead, and each block's values while its scores are computed (into L2,
// for the pass over the values). llama-160m's decode on 2 threads of an Intel Xeon: the attention
// of 12 heads over 200 keys, its cache from L3, 57 -> 48 us; a token 0.4-0.6 ms faster (of ~16).
// Both kept on the AMD EPYC Zen 4 (family 25 model 17, 2026-12-04): 48 layers' decode attention
// (12 heads, 192 of 256 keys) cycled from DRAM, 40 interleaved rounds, the median of each round's
// ratio to these: 0, 8, 16, 48, 64, 96 rows ahead took 1.01-1.09x the time, prefetcht1 1.03x,
// prefetcht0 1.42x (where int8's GEMV lost a quarter of its speed to its far prefetch).
#ifdef KILN_KEYS_AHEAD  // (to time another distance, in rows)
constexpr int64_t KEYS_AHEAD = KILN_KEYS_AHEAD;
#else
constexpr int64_t KEYS_AHEAD = 2 * L;
#endif
#ifdef KILN_ATTENTION_LOCALITY
constexpr int ATTENTION_LOCALITY = KILN_ATTENTION_LOCALITY;
#else
constexpr int ATTENTION_LOCALITY = 1;
#endif
static inline void prefetch_row(const float* row, int64_t n) {
  for (int64_t c = 0; c < n; c += 16) __builtin_prefetch(row + c, 0, ATTENTION_LOCALITY);  // a line of 16 floats
}

// kᵀ of keys [0, keys) into panels [p][D][NR_S], the columns past `keys` zero to the end of the
// vector that holds the last key (the score tiles read whole vectors up to a block's last key, no
// further; zeroing the rest of the last panel column by column was a third of this pass at 160
// keys): blocks of L keys x L dimensions transposed in registers, a last partial block's missing
// keys as zero rows (a D that is not a multiple of L: its last dimensions one by one). The keys are asked for
// KEYS_AHEAD rows ahead and the values' rows [0, keys) (v, v_s, Dv) as each block of keys passes,
// as few_rows does: a grouped-query decode step (Qwen2-0.5B: 7 query rows a key-value head, more
// than FEW_ROWS) packs a cache that comes from memory. Qwen2-0.5B's step, 2 heads of 7 rows over
// 192 of 256 keys, 24 layers' caches after a 64 MB read, 2 threads of a 2-core AMD EPYC (Zen 4):
// 23.0 -> 18.9 us a layer; TinyLlama-1.1B's (4 heads of 8 rows) 42.3 -> 36.6 (means of 10 runs each).
// One panel at a time (pack_panel) into `dst` [D][NR_S]; the first KEYS_AHEAD keys are asked for
// by the caller (ask_first_keys).
static inline void ask_first_keys(const float* k, int64_t k_s, int64_t D, int64_t keys) {
  for (int64_t j = 0; j < std::min<int64_t>(keys, KEYS_AHEAD); ++j) prefetch_row(k + j * k_s, D);
}

static inline void pack_panel(const float* k, int64_t k_s, int64_t D, int64_t keys, int64_t p, float* dst,
                              const float* v, int64_t v_s, int64_t Dv) {
  const int64_t read_keys = (keys + L - 1) / L * L, whole_d = D / L * L;
  for (int64_t j0 = p * NR_S; j0 < std::min<int64_t>(read_keys, (p + 1) * NR_S); j0 += L) {
    const int n = int(std::min<int64_t>(L, keys - j0));  // the block's keys; its rows past them are zeros
    for (int64_t j = j0 + KEYS_AHEAD; j < std::min<int64_t>(keys, j0 + KEYS_AHEAD + L); ++j) prefetch_row(k + j * k_s, D);
    for (int64_t j = j0; j < j0 + n; ++j) prefetch_row(v + j * v_s, Dv);
    float* block = dst + j0 % NR_S;
    for (int64_t d0 = 0; d0 < whole_d; d0 += L) {
      V r[L];
#pragma GCC unroll 16
      for (int i = 0; i < L; ++i) r[i] = i < n ? kiln::load(k + (j0 + i) * k_s + d0) : V{};
      transpose(r);
#pragma GCC unroll 16
      for (int i = 0; i < L; ++i) kiln::store(block + (d0 + i) * NR_S, r[i]);
    }
    for (int64_t d = whole_d; d < D; ++d)
      for (int i = 0; i < L; ++i) block[d * NR_S + i] = i < n ? k[(j0 + i) * k_s + d] : 0.0f;
  }
}

static inline void pack_keys(const float* k, int64_t k_s, int64_t D, int64_t keys, float* kt, const float* v,
                             int64_t v_s, int64_t Dv) {
  ask_first_keys(k, k_s, D, keys);
  for (int64_t p = 0; p * NR_S < keys; ++p) pack_panel(k, k_s, D, keys, p, kt + p * D * NR_S, v, v_s, Dv);
}

// A vector's lanes combined by op (max, sum, or): halves combined, log2(L) steps.
template <typename W, typename Op> static inline auto lanes_reduce(W x, Op op) {
  if constexpr (sizeof(W) == 2 * sizeof(x[0])) return op(x[0], x[1]);
  else {
    using H = kiln::half_t<W>;
    return lanes_reduce(op(kiln::part<H>(x, 0), kiln::part<H>(x, 1)), op);
  }
}
// (A row's running maximum is never NaN: it starts at -inf and is raised by comparisons only.)
static inline float lane_max(V x) { return lanes_reduce(x, [](auto a, auto b) { return a > b ? a : b; }); }
static inline float lane_sum(V x) { return lanes_reduce(x, [](auto a, auto b) { return a + b; }); }
static inline int32_t lane_or(kiln::vec<int32_t> x) { return lanes_reduce(x, [](auto a, auto b) { return a | b; }); }

// e^x for x <= 0 (a score less the row's maximum), NaN kept; 0 below -87 (e^x < 2^-125, nothing
// beside the maximum's 1), so 2^n is one normal factor.
static inline V exp_nonpositive(V x) {
  const auto underflow = x < -87.0f;
  kiln_vm::ui_t<V> n;
  V r = kiln_vm::exp_reduce(underflow ? V{} - 87.0f : x, n);
  V e = (1.0f + kiln_vm::expm1_poly(r)) * kiln_vm::pow2i<V>(n);
  return underflow ? V{} : e;
}

// Row `s` of scaled and masked scores [0, end) (whole vectors: the lanes past `end` hold -inf),
// its maximum `m`: exp(x - m) in place; returns 1 / their sum. A row of -inf only becomes 0 and
// returns 0; one of NaN (whose maximum the comparisons never raised) becomes NaN.
static inline float softmax_row(float* s, int64_t end, float m) {
  if (m == -std::numeric_limits<float>::infinity()) {
    const bool nan = std::any_of(s, s + end, [](float x) { return std::isnan(x); });
    std::fill(s, s + end, nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
    return nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  }
  V sum{};
  for (int64_t j = 0; j < end; j += L) {
    V e = exp_nonpositive(kiln::load(s + j) - m);
    kiln::store(s + j, e);
    sum += e;
  }
  return 1.0f / lane_sum(sum);
}

struct Buffers {
  std::vector<float> keys, scores, inverse;
  std::vector<V> row_max;
};

// The end of mask_row[0, end) once its trailing masked keys are cut: those of -inf or, with
// `far_below`, of any value at most -1e30 (HuggingFace writes masks with the most negative float;
// NaN is neither). A vector at a time while all of it is masked, then key by key.
template <bool FarBelow> static inline int64_t trailing_end(const float* mask_row, int64_t end) {
  constexpr int32_t minus_inf = int32_t(0xff800000u), far = 0x7149f2ca, inf = 0x7f800000;  // -inf's, 1e30's, inf's bits
  for (; end >= L; end -= L) {
    kiln::vec<int32_t> bits;
    std::memcpy(&bits, mask_row + end - L, sizeof bits);
    kiln::vec<int32_t> kept;  // nonzero in a lane not masked
    if constexpr (FarBelow) {
      const kiln::vec<int32_t> magnitude = bits & int32_t(0x7fffffff);
      kept = (bits >= 0) | (magnitude < far) | (magnitude > inf);
    } else {
      kept = bits ^ minus_inf;  // -inf's bits, and no other float's
    }
    if (lane_or(kept) != 0) break;
  }
  auto masked = [](float x) { return FarBelow ? x <= -1e30f : x == -std::numeric_limits<float>::infinity(); };
  while (end > 0 && masked(mask_row[end - 1])) --end;
  return end;
}

// Where row i's keys end: a causal row's after its own key, and a masked row's after the last key
// its mask leaves above -inf (a causal mask written out, as GPT-2 and Llama give it; padding): the
// keys after it weigh e^-inf = 0, so their scores are never computed. Keys masked with a value of
// at most -1e30 (T5's causal mask, BERT's padding: the most negative float) are cut too where the
// row has a key of an ordinary mask value (above -1e20): beside it they weigh e^(x - max) = 0
// exactly (x - max below -8e29) for any scaled score below 1e29 in magnitude. A row of such keys
// only keeps them (its softmax is even over them, as ATen computes it).
static inline int64_t row_end(const Shape& z, const float* mask_row, bool causal, int64_t i) {
  int64_t end = causal ? std::min(z.Sk, i + 1) : z.Sk;
  if (!mask_row) return end;
  end = trailing_end<false>(mask_row, end);
  const int64_t far = trailing_end<true>(mask_row, end);
  if (far < end && std::any_of(mask_row, mask_row + far, [](float x) { return x > -1e20f; })) end = far;
  return end;
}

// Whether mask_row[0, end) is all zeros, of either sign: adding it changes no score (x + 0 is x,
// NaN and infinities included; -0 becomes +0, the same to softmax).
static inline bool zeros(const float* mask_row, int64_t end) {
  int64_t j = 0;
  for (; j + L <= end; j += L) {
    kiln::vec<int32_t> bits;
    std::memcpy(&bits, mask_row + j, sizeof bits);
    if (lane_or(bits & int32_t(0x7fffffff)) != 0) return false;
  }
  for (; j < end; ++j)
    if (mask_row[j] != 0.0f) return false;
  return true;
}

// An attention of at most FEW_ROWS query rows (a decode step's one row, a few speculative ones)
// reads the keys where they lie: packing kᵀ is a pass over the head's keys that so few rows never
// amortize (a decode step's attention is a read of its KV cache, nothing more).
constexpr int64_t FEW_ROWS = 4;

// The scores of query row `qr` against keys [j0, j0 + n), n <= L: L dot products of length D,
// D's vectors outermost (L independent sums), transposed in registers and summed into one vector.
// Lanes past n repeat key j0's product (the caller sets them to -inf).
static inline V key_dots(const float* qr, const float* k, int64_t k_s, int64_t D, int64_t j0, int n) {
  const float* rows[L];
#pragma GCC unroll 16
  for (int t = 0; t < L; ++t) rows[t] = k + (j0 + (t < n ? t : 0)) * k_s;
  V acc[L];
#pragma GCC unroll 16
  for (int t = 0; t < L; ++t) acc[t] = V{};
  const int64_t whole = D / L * L;
  for (int64_t d = 0; d < whole; d += L) {
    const V x = kiln::load(qr + d);
#pragma GCC unroll 16
    for (int t = 0; t < L; ++t) acc[t] += x * kiln::load(rows[t] + d);
  }
  transpose(acc);
#pragma GCC unroll 16
  for (int t = 1; t < L; ++t) acc[0] += acc[t];
  if (whole < D) {  // D not a multiple of L: its last values key by key
    float tail[L] = {};
    for (int t = 0; t < n; ++t)
      for (int64_t d = whole; d < D; ++d) tail[t] += qr[d] * rows[t][d];
    acc[0] += kiln::load(tail);
  }
  return acc[0];
}

// o[0, NVX vectors) = inverse * sum over keys j < end of p[j] * v's row j; two keys a step, each
// into accumulators of its own (two independent chains of additions).
template <int NVX>
static inline void weighted_rows(const float* p, int64_t end, const float* v, int64_t v_s, float* o, float inverse) {
  V a[NVX], b[NVX];
#pragma GCC unroll 8
  for (int c = 0; c < NVX; ++c) a[c] = b[c] = V{};
  int64_t j = 0;
  for (; j + 2 <= end; j += 2) {
    const V p0 = kiln::splat(p[j]), p1 = kiln::splat(p[j + 1]);
#pragma GCC unroll 8
    for (int c = 0; c < NVX; ++c) {
      a[c] += p0 * kiln::load(v + j * v_s + c * L);
      b[c] += p1 * kiln::load(v + (j + 1) * v_s + c * L);
    }
  }
  if (j < end) {
    const V p0 = kiln::splat(p[j]);
#pragma GCC unroll 8
    for (int c = 0; c < NVX; ++c) a[c] += p0 * kiln::load(v + j * v_s + c * L);
  }
#pragma GCC unroll 8
  for (int c = 0; c < NVX; ++c) kiln::store(o + c * L, (a[c] + b[c]) * inverse);
}

// Query rows [i_lo, i_hi) (at most FEW_ROWS) of one head, at qh, kh, vh, mh (or none), oh: each
// row's scores (scaled, masked, -inf past its end) into one row of buf.scores, its softmax, then
// out = P · v.
static void few_rows(const Shape& z, const float* qh, const float* kh, const float* vh, const float* mh, float* oh,
                     float scale, int64_t i_lo, int64_t i_hi, const int64_t* ends, Buffers& buf) {
  buf.scores.resize((z.Sk + L - 1) / L * L);
  float* row = buf.scores.data();
  const V minus_inf = V{} - std::numeric_limits<float>::infinity();
  for (int64_t i = i_lo; i < i_hi; ++i) {
    const int64_t end = ends[i];
    const float* qr = qh + i * z.q_s;
    const float* mr = mh ? mh + i * z.m_q : nullptr;
    V m = minus_inf;
    const bool first = i == i_lo;
    if (first)
      for (int64_t j = 0; j < std::min<int64_t>(end, KEYS_AHEAD); ++j) prefetch_row(kh + j * z.k_s, z.D);
    for (int64_t j0 = 0; j0 < end; j0 += L) {
      const int n = int(std::min<int64_t>(L, end - j0));
      if (first) {
        for (int64_t j = j0 + KEYS_AHEAD; j < std::min<int64_t>(end, j0 + KEYS_AHEAD + L); ++j)
          prefetch_row(kh + j * z.k_s, z.D);
        for (int64_t j = j0; j < j0 + n; ++j) prefetch_row(vh + j * z.v_s, z.Dv);
      }
      V x = key_dots(qr, kh, z.k_s, z.D, j0, n) * scale;
      if (n == L) {
        if (mr) x += kiln::load(mr + j0);
      } else {
        if (mr) x += kiln_gemm::load_n(mr + j0, false, n);
        x = kiln::select(kiln::vlt(kiln::iota<int32_t>(0, 1), kiln::splat<int32_t>(n)), x, minus_inf);
      }
      kiln::store(row + j0, x);
      m = x > m ? x : m;
    }
    const float inverse = softmax_row(row, end, lane_max(m));
    for (int64_t d0 = 0; d0 < z.Dv; d0 += NV_O * L) {
      const int nv = int(std::min<int64_t>(NV_O, (z.Dv - d0) / L));
      sized<1, NV_O>(1, nv, [&](auto, auto NVX) {
        weighted_rows<decltype(NVX)::value>(row, end, vh + d0, z.v_s, oh + i * z.o_s + d0, inverse);
      });
    }
  }
}

// Query rows [i_lo, i_hi) of head (b, h); `ends`: each of the head's rows' end (row_end).
static void rows_of_head(const Shape& z, const float* q, const float* k, const float* v, const float* mask, float* out,
                         float scale, int64_t b, int64_t h, int64_t i_lo, int64_t i_hi, const int64_t* ends,
                         Buffers& buf) {
  const float* qh = q + b * z.q_b + h * z.q_h;
  const float* vh = v + b * z.v_b + h * z.v_h;
  float* oh = out + b * z.o_b + h * z.o_h;
  const float* mh = mask ? mask + b * z.m_b + h * z.m_h : nullptr;
  // The latest end among rows [r0, r1).
  // (By the attention's query count, not the task's: a row's arithmetic must not depend on how
  // the rows were split among threads — an export run by another thread count gives the same bits.)
  if (z.Sq <= FEW_ROWS) {
    few_rows(z, qh, k + b * z.k_b + h * z.k_h, vh, mh, oh, scale, i_lo, i_hi, ends, buf);
    return;
  }
  auto last_end = [&](int64_t r0, int64_t r1) { return *std::max_element(ends + r0, ends + r1); };
  const int64_t task_keys = last_end(i_lo, i_hi);
  const int64_t lds = (z.Sk + L - 1) / L * L;
  // Rows of one block (a decode step's grouped query rows, a short prompt) read each panel of kᵀ
  // once: it is packed just before its score tiles, into a panel that stays in L1, not into a
  // buffer of the whole head's keys that the tiles read back from L2 (the pack's stores to it took
  // as long as its loads and transposes). Qwen2-0.5B's decode attention (2 heads of 7 rows, 24
  // layers' caches after a 64 MB read, 2 threads of an Intel Xeon with AMX, 30 interleaved rounds):
  // 19.6 -> 17.6 us a layer at 193 keys, 51.9 -> 47.2 at 1001, 122.1 -> 96.5 at 2001, 291 -> 214 at 4001.
  const float* kh = k + b * z.k_b + h * z.k_h;
  const bool one_block = i_hi - i_lo <= QB;
  buf.keys.resize((one_block ? 1 : std::max<int64_t>(1, (task_keys + NR_S - 1) / NR_S)) * NR_S * z.D);
  buf.scores.resize(QB * lds);
  buf.inverse.resize(QB);
  buf.row_max.resize(QB);
  float* kt = buf.keys.data();
  float* s = buf.scores.data();
  if (one_block) ask_first_keys(kh, z.k_s, z.D, task_keys);
  else pack_keys(kh, z.k_s, z.D, task_keys, kt, vh, z.v_s, z.Dv);
  for (int64_t i0 = i_lo; i0 < i_hi; i0 += QB) {
    const int64_t i1 = std::min(i_hi, i0 + QB), keys = last_end(i0, i1);
    // S = q · kᵀ, scaled and masked, each row's maximum kept: tiles wholly past their rows' ends
    // (above a causal diagonal) are skipped.
    std::fill(buf.row_max.begin(), buf.row_max.end(), V{} - std::numeric_limits<float>::infinity());
    for (int64_t p = 0; p * NR_S < keys; ++p) {
      const int nv = int((std::min<int64_t>(NR_S, keys - p * NR_S) + L - 1) / L);
      if (one_block) pack_panel(kh, z.k_s, z.D, task_keys, p, kt, vh, z.v_s, z.Dv);
      const float* panel = one_block ? kt : kt + p * z.D * NR_S;
      for (int64_t r0 = i0; r0 < i1; r0 += MR_S) {
        const int rows = int(std::min<int64_t>(MR_S, i1 - r0));
        if (p * NR_S >= last_end(r0, r0 + rows)) continue;
        const ScoreStore st{scale, mh ? mh + r0 * z.m_q + p * NR_S : nullptr, z.m_q, p * NR_S,
                            ends + r0, buf.row_max.data() + (r0 - i0)};
        sized<MR_S, NV_S>(rows, nv, [&](auto R, auto NVX) {
          score_tile<decltype(R)::value, decltype(NVX)::value>(z.D, qh + r0 * z.q_s, z.q_s, panel,
                                                               s + (r0 - i0) * lds + p * NR_S, lds, st);
        });
      }
    }
    // Each row's probabilities up to its end, zeros from there to the block's last key.
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t end = ends[i];
      float* row = s + (i - i0) * lds;
      buf.inverse[i - i0] = softmax_row(row, end, lane_max(buf.row_max[i - i0]));
      std::fill(row + end, row + keys, 0.0f);
    }
    // out = P · v, each row times its inverse sum.
    for (int64_t d0 = 0; d0 < z.Dv; d0 += NV_O * L) {
      const int nv = int(std::min<int64_t>(NV_O, (z.Dv - d0) / L));
      for (int64_t r0 = i0; r0 < i1; r0 += MR_O) {
        const int rows = int(std::min<int64_t>(MR_O, i1 - r0));
        const int64_t kc = last_end(r0, r0 + rows);
        sized<MR_O, NV_O>(rows, nv, [&](auto R, auto NVX) {
          tile<decltype(R)::value, decltype(NVX)::value>(kc, s + (r0 - i0) * lds, lds, vh + d0, z.v_s,
                                                         oh + r0 * z.o_s + d0, z.o_s, buf.inverse.data() + (r0 - i0));
        });
      }
    }
  }
}

// The whole attention. Dv must be a multiple of L (the caller checks: kiln/externs/kiln_attention.py).
static void attention(const Shape& z, const float* q, const float* k, const float* v, const float* mask, float* out,
                      float scale, bool causal) {
  const int64_t heads = z.B * z.H;
  const int threads = kiln::team();
  // Heads split into row ranges where there are too few for every thread to have two tasks, but
  // not heads of a few rows that divide evenly among the threads: each part of a head packs the
  // head's keys again (pack_keys, a pass over a cache that comes from memory), and so few rows'
  // arithmetic is shorter than that pass. Qwen2-0.5B's decode step (2 key-value heads of 7 query
  // rows, 2 threads of a 2-core AMD EPYC, Zen 4; its int4 decode profiled, 4 pairs in one process):
  // each head split in two, 560 us a step of attention; a head a thread, 534.
  const bool few_even = heads % threads == 0 && z.Sq <= 2 * MR_S;
  int64_t splits = heads >= 2 * threads || few_even ? 1 : (2 * threads + heads - 1) / heads;
  splits = std::max<int64_t>(1, std::min<int64_t>(splits, (z.Sq + MR_S - 1) / MR_S));
  const int64_t rows = ((z.Sq + splits - 1) / splits + MR_S - 1) / MR_S * MR_S;
  splits = (z.Sq + rows - 1) / rows;
  const int64_t tasks = heads * splits;
  // Each query row's end, once a call: per batch and head where the mask differs by head, else
  // per batch (GPT-2's causal mask serves all heads). A mask that is zero before every row's end
  // (a causal or padding mask of 0 and -inf; BERT's of an unpadded input) is not added at all.
  const int64_t mask_heads = mask && z.m_h != 0 ? z.H : 1, mask_batches = mask && z.m_b != 0 ? z.B : 1;
  std::vector<int64_t> ends(mask_batches * mask_heads * z.Sq);
  bool mask_adds = false;
#pragma omp parallel if (tasks > 1 && z.Sq * z.Sk * z.D * heads >= (int64_t(1) << 16)) num_threads(threads)
  {
#pragma omp for schedule(static) reduction(|| : mask_adds)
    for (int64_t r = 0; r < int64_t(ends.size()); ++r) {
      const int64_t b = r / (mask_heads * z.Sq), h = r / z.Sq % mask_heads, i = r % z.Sq;
      const float* row = mask ? mask + b * z.m_b + h * z.m_h + i * z.m_q : nullptr;
      ends[r] = row_end(z, row, causal, i);
      mask_adds = mask_adds || (row && !zeros(row, ends[r]));
    }
    static thread_local Buffers buf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t head = t / splits, part = t % splits, b = head / z.H, h = head % z.H;
      const int64_t mask_head = (mask_batches > 1 ? b : 0) * mask_heads + (mask_heads > 1 ? h : 0);
      rows_of_head(z, q, k, v, mask_adds ? mask : nullptr, out, scale, b, h, part * rows,
                   std::min(z.Sq, (part + 1) * rows), ends.data() + mask_head * z.Sq, buf);
    }
  }
}

}  // namespace kiln_attention
