// kiln's own GEMM: C[M, N] = epilogue(A[M, K] @ B[K, N]) over a B packed once, at freezing.
//
// The structure is the classic one of high-performance BLAS (Goto; BLIS): B is packed into panels
// of NR columns, [ceil(N / NR)][K][NR], zero-padded, so the micro-kernel reads it with aligned
// vector loads in exactly the order it consumes it; each thread packs blocks of A's rows into
// MR-row panels as it goes. The micro-kernel keeps an MR x NR block of C in registers (MR x NV
// vectors of kiln::L lanes) and, for each k, loads NV vectors of B and broadcasts MR scalars of A:
// MR * NV fused multiply-adds for NV + MR loads. Threads split the N panels (each weight panel is
// read by one thread: the weight is the largest stream at transformer shapes) and, when there are
// fewer panels than threads would need, M too. Long K is cut in blocks, the outermost loop.
//
// The epilogue runs on the registers before the one store of C: bias, a unary op (the post-ops
// oneDNN offers), a residual added after it (or before it: a convolution's added tensor), and a
// float32 or bfloat16 output. A layer norm over each row of a float32 C may follow, in the same
// parallel region once every thread has stored its tiles, while C is still in the caches.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <omp.h>
#include <thread>
#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace kiln_gemm {
using kiln::L;
using V = kiln::vec<float>;

// Register blocking per ISA: accumulators MR * NV plus NV loads of B and one broadcast must fit
// the register file (32 vector registers with AVX-512, 16 with AVX2 and SSE, 32 with NEON).
#if defined(KILN_GEMM_MR) && defined(KILN_GEMM_NV)  // to time another blocking: -DKILN_GEMM_MR=12 -DKILN_GEMM_NV=2
constexpr int MR = KILN_GEMM_MR, NV = KILN_GEMM_NV;
#elif KILN_VEC_BYTES == 64
constexpr int MR = 8, NV = 3;
#elif KILN_VEC_BYTES == 32
constexpr int MR = 6, NV = 2;
#elif defined(__aarch64__)
constexpr int MR = 8, NV = 3;
#else
constexpr int MR = 6, NV = 2;
#endif
constexpr int NR = NV * L;

enum Unary : int32_t { NONE = 0, RELU, GELU, GELU_TANH, SILU, SIGMOID, TANH, HARDSWISH, LEAKY_RELU, HARDTANH };

// What a row of C becomes once all of it is stored: LAYER_NORM (row - mean) / sqrt(var + eps) * w + b;
// RMS_NORM row / sqrt(mean(row^2) + eps) * w (T5, Llama; no mean, no b); SOFTMAX exp(row - max) /
// sum(exp(row - max)); LOG_SOFTMAX row - max - log(sum(exp(row - max))) (a classifier's or an MoE
// router's logits; no w, b, eps).
enum RowNorm : int32_t { NO_ROW_NORM = 0, LAYER_NORM, RMS_NORM, SOFTMAX, LOG_SOFTMAX };

// What happens to an MR x NR block between the accumulators and memory. Passed by pointer from
// Python (ctypes), so its layout is fixed: kiln/externs/kiln_gemm.py mirrors it.
struct Epilogue {
  const void* bias;       // [N] or null
  const void* residual;   // [M, N] with row stride ld_residual, added after the unary op; or null
  int64_t ld_residual;
  int32_t bias_bf16, residual_bf16, out_bf16;  // element types: bfloat16, else float32
  int32_t unary;          // Unary
  float scalar0, scalar1; // leaky_relu's slope; hardtanh's bounds
  int32_t residual_before_unary;  // unary(acc + bias + residual), as kiln::conv adds its `other`
  int32_t row_norm;       // then each row of C normalized (RowNorm), in place or to norm_out
  float norm_eps;
  const float* norm_weight;  // [N] or null (1)
  const float* norm_bias;    // [N] or null (0)
  void* norm_out;            // the normalized rows' own [M, N] (row stride ld_norm_out), C keeping the sum; or null: in place
  int64_t ld_norm_out;
  int32_t norm_out_bf16;     // norm_out holds bfloat16 (C, always float32 under a row norm, holds the sum)
  void* sum_out;             // or null: the sum rounded to bfloat16 there too (row stride ld_sum_out), as
  int64_t ld_sum_out;        // the row pass reads it (a bfloat16 pre-norm model's residual stream)
  // A gated product's width H (0: not gated): B's columns are two halves of whole panels, a gated
  // MLP's gate (columns [0, H)) and up (the same from the half on), and C [M, H] is
  // U(gate + bias[j]) * (up + bias[H + j]): no residual, no row norm (gated_value).
  int64_t gated_width;
};

// bfloat16 dot products in pairs of k (vdpbf16ps) where the CPU has them; elsewhere bfloat16 is
// widened to float32 on load and multiplied as float32.
#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
constexpr bool BF16_PAIRS = true;
#else
constexpr bool BF16_PAIRS = false;
#endif

// One fused multiply-add per register: kernels are compiled with -ffp-contract=off (eager rounds
// a * b + c twice), so the GEMM asks for its FMAs by name.
static inline V fma(V a, V b, V c) {
#if KILN_VEC_BYTES == 64
  return _mm512_fmadd_ps(a, b, c);
#elif KILN_VEC_BYTES == 32 && defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#elif defined(__aarch64__)
  return vfmaq_f32(c, a, b);
#else
  return a * b + c;
#endif
}

// The unary op U on a vector, U a compile-time constant (see with_unary).
template <int U> static inline V unary_op(V y, const Epilogue& e) {
  if constexpr (U == RELU) return y < 0 ? V{} : y;
  else if constexpr (U == GELU) return y * 0.5f * (1.0f + kiln_verf(y * 0.70710678118654752440f));
  else if constexpr (U == GELU_TANH) {
    // 0.5 y (1 + tanh u) written as y sigmoid(2u), the same function: one exponential and one
    // divide where tanh takes a polynomial besides (GPT-2's 128x768x3072 with it: 3.94 -> 3.84 ms
    // on one thread of an Intel Xeon, 3.60 without; 0.75-0.89x at K = 16-144). 2u is taken
    // within +-80 so that e^-|2u| is never denormal (arithmetic on denormals takes a microcode
    // assist: 3x slower); below -80 the factor is 0, as 1 + tanh u is in eager (so y = -inf
    // gives NaN, as there); above, sigmoid is 1 in float32.
    const V two_u = 1.5957691216057307118f * (y + 0.044715f * y * y * y);
    const V factor = kiln_vsigmoid(kiln_vm::clamp(two_u, -80.0f, 80.0f));
    return y * (two_u < -80.0f ? V{} : factor);
  } else if constexpr (U == SILU) return y * kiln_vsigmoid(y);
  else if constexpr (U == SIGMOID) return kiln_vsigmoid(y);
  else if constexpr (U == TANH) return kiln_vtanh(y);
  else if constexpr (U == HARDSWISH) {
    V t = y + 3.0f;
    t = t < 0 ? V{} : t;
    t = t > 6.0f ? V{} + 6.0f : t;
    return y * t / 6.0f;
  } else if constexpr (U == LEAKY_RELU) return y > 0 ? y : y * e.scalar0;
  else if constexpr (U == HARDTANH) {
    V lo = e.scalar0 - V{}, hi = e.scalar1 - V{};
    V r = y < lo ? lo : y;
    return r > hi ? hi : r;
  } else return y;
}

// f(std::integral_constant<int, U>{}) with U the unary op `u`: an epilogue's loop instantiated per
// op, so that the op is inlined into it and chosen once, not per vector.
template <typename F> static inline void with_unary(int u, F&& f) {
  using std::integral_constant;
  switch (u) {
    case RELU: return f(integral_constant<int, RELU>{});
    case GELU: return f(integral_constant<int, GELU>{});
    case GELU_TANH: return f(integral_constant<int, GELU_TANH>{});
    case SILU: return f(integral_constant<int, SILU>{});
    case SIGMOID: return f(integral_constant<int, SIGMOID>{});
    case TANH: return f(integral_constant<int, TANH>{});
    case HARDSWISH: return f(integral_constant<int, HARDSWISH>{});
    case LEAKY_RELU: return f(integral_constant<int, LEAKY_RELU>{});
    case HARDTANH: return f(integral_constant<int, HARDTANH>{});
    default: return f(integral_constant<int, NONE>{});
  }
}

// The unary op of `e` on a vector, chosen at run time (ragged edges; with_unary for loops).
static inline V unary(V y, const Epilogue& e) {
  V out = y;
  with_unary(e.unary, [&](auto op) { out = unary_op<decltype(op)::value>(y, e); });
  return out;
}

// The unary op of `e` in place over `count` vectors at p, p + stride, ...: one loop per op
// (with_unary), where a caller's loop would call unary() per vector (kiln_depthwise.h's rows of
// pixels). Not flattened, nor is epilogue_in_place: with the ops' math inlined into them (one call
// per vector to sigmoid or tanh saved) kiln's library measured its plain GEMMs at K = 16-64 5-24 %
// slower, though these functions are not on that path (code placement), for 2-3 % on SiLU.
[[gnu::noinline]] static void unary_in_place(float* p, int64_t stride, int count, const Epilogue& e) {
  with_unary(e.unary, [&](auto op) {
    for (int i = 0; i < count; ++i) kiln::store(p + i * stride, unary_op<decltype(op)::value>(kiln::load(p + i * stride), e));
  });
}

// n <= L elements as float32 lanes (the rest zero), from float32 or bfloat16 memory.
static inline V load_n(const void* p, bool bf16, int n) {
  if (bf16) {
    const kiln_bf16* q = static_cast<const kiln_bf16*>(p);
    return n == L ? kiln::load_bf16(q) : kiln::lanes<float>([&](int l) { return l < n ? float(q[l]) : 0.0f; });
  }
  const float* q = static_cast<const float*>(p);
  return n == L ? kiln::load(q) : kiln::lanes<float>([&](int l) { return l < n ? q[l] : 0.0f; });
}

static inline void store_n(void* p, bool bf16, V y, int n, bool stream = false) {
  if (bf16) {
    kiln_bf16* q = static_cast<kiln_bf16*>(p);
    if (n == L) kiln::store_bf16(q, y);
    else for (int l = 0; l < n; ++l) q[l] = kiln_bf16(y[l]);
  } else {
    float* q = static_cast<float*>(p);
    if (n == L && stream) kiln::store_stream(q, y);
    else if (n == L) kiln::store(q, y);
    else for (int l = 0; l < n; ++l) q[l] = y[l];
  }
}

static inline const void* at(const void* p, bool bf16, int64_t offset) {
  return bf16 ? static_cast<const void*>(static_cast<const kiln_bf16*>(p) + offset)
              : static_cast<const void*>(static_cast<const float*>(p) + offset);
}

// y (its bias added) through the rest of e's epilogue, as both of the GEMM's stores apply it: the
// residual's n lanes at `residual` (null: none) added before or after the unary op U, as e says.
template <int U> static inline V residual_and_op(V y, const void* residual, int n, const Epilogue& e) {
  if (residual && e.residual_before_unary) y += load_n(residual, e.residual_bf16, n);
  if constexpr (U != NONE) y = unary_op<U>(y, e);
  if (residual && !e.residual_before_unary) y += load_n(residual, e.residual_bf16, n);
  return y;
}

// A gated product's value at columns [j, j + n) (Epilogue::gated_width): the gate's sums g and up's
// u, each with its half of the bias, as U(g) * u.
static inline V gated_value(V g, V u, int64_t j, int n, const Epilogue& e) {
  if (e.bias) {
    g += load_n(at(e.bias, e.bias_bf16, j), e.bias_bf16, n);
    u += load_n(at(e.bias, e.bias_bf16, e.gated_width + j), e.bias_bf16, n);
  }
  with_unary(e.unary, [&](auto op) { g = unary_op<decltype(op)::value>(g, e); });
  return g * u;
}

// Store `rows` x `cols` of the accumulator block at C[i0, j0] (cols <= NR), each vector through
// the epilogue on the last K block (as float32 partial sums before it): a ragged edge or a
// bfloat16 C (tile stores the other blocks). `stream`: whole float32 vectors with streaming
// stores (stream_row_output's C).
template <int R>
static inline void store_block(V (&acc)[R][NV], int rows, int cols, int64_t i0, int64_t j0, void* c, int64_t ldc,
                               const Epilogue* e, bool last, bool stream = false) {
  const bool out_bf16 = last && e && e->out_bf16;
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    for (int v = 0; v < NV; ++v) {
      const int64_t j = j0 + v * L;
      const int n = std::min(L, cols - v * L);
      if (n <= 0) break;
      V y = acc[r][v];
      if (last && e) {
        if (e->bias) y += load_n(at(e->bias, e->bias_bf16, j), e->bias_bf16, n);
        const void* residual = e->residual ? at(e->residual, e->residual_bf16, i * e->ld_residual + j) : nullptr;
        with_unary(e->unary, [&](auto op) { y = residual_and_op<decltype(op)::value>(y, residual, n, *e); });
      }
      store_n(const_cast<void*>(at(c, out_bf16, i * ldc + j)), out_bf16, y, n, stream);
    }
  }
}

// Whether a product of a decode step's few rows stores its C (N float32 columns a row) with
// streaming stores (store_block's `stream`; the thread fences them before the region's barrier,
// kiln::store_stream_fence). A wide row's lines, written as the weights stream past, were read
// from memory first and went back dirty among the weights' lines: an Intel Xeon with AMX (family
// 6 model 167, 2 threads, int4 weights from DRAM on 2 MB pages, 16-40 interleaved rounds):
// Qwen2-0.5B's LM head (1 x 896 x 151936) 2333.8 -> 2215.1 us, its gate/up (1 x 896 x 9728)
// 154.4 -> 147.8 us (a plain read of the packs' bytes: ~2119 and ~133 us); narrower rows (1152,
// 896 columns) unchanged; float32's (gemv) within noise (1.005x the step's time without). Not
// where C is read again (a row norm's pass) or is bfloat16. KILN_STREAM_ROW_BYTES (0: never)
// times another width (docs/gemm.md).
#ifdef KILN_STREAM_ROW_BYTES
constexpr int64_t STREAM_ROW_BYTES = KILN_STREAM_ROW_BYTES;
#else
constexpr int64_t STREAM_ROW_BYTES = int64_t(32) << 10;
#endif
static inline bool stream_row_output(int64_t M, int64_t N, const void* c, int64_t ldc, const Epilogue* e) {
  return STREAM_ROW_BYTES > 0 && N * int64_t(sizeof(float)) >= STREAM_ROW_BYTES && !(e && (e->out_bf16 || e->row_norm)) &&
         (M == 1 || ldc % L == 0) && reinterpret_cast<uintptr_t>(c) % KILN_VEC_BYTES == 0;
}

// The B panel's rows this many steps ahead are asked into L1 (the panel's K block lives in L2:
// measured 3-5 % faster at transformer shapes than leaving it to the hardware prefetcher).
#ifdef KILN_GEMM_PREFETCH  // to time another distance
constexpr int PREFETCH = KILN_GEMM_PREFETCH;
#else
constexpr int PREFETCH = 8;
#endif
// Blocks of fewer than 8 accumulators (M = 1 or 2: a GEMV, memory-bound) ask further ahead: their
// steps are shorter than a tile's. One thread of an Intel Xeon, against 8: 1x4096x4096 0.98x,
// 1x3072x768 0.98x, 1x512x512 0.97x, 1x768x768 1.00x; no prefetch at all: 1x768x768 1.06x.
#ifdef KILN_GEMM_PREFETCH_GEMV
constexpr int PREFETCH_GEMV = KILN_GEMM_PREFETCH_GEMV;
#else
constexpr int PREFETCH_GEMV = 16;
#endif
#ifdef KILN_GEMM_AHEAD_MAX_SHIFT  // to time other spacings (0: every line in the first tiles)
constexpr int AHEAD_MAX_SHIFT = KILN_GEMM_AHEAD_MAX_SHIFT;
#else
constexpr int AHEAD_MAX_SHIFT = 4;
#endif

// Memory to bring into L2 while a tile computes: from `at` (nullptr: none), one new cache line
// every 2^shift steps. The next panel's block, spread over all the tiles of the current one (see
// gemm). Each step asks for its line (2^shift times the same one): a branch to ask once was
// slower than the repeats, which cost one load slot beside the step's fourteen.
struct Ahead {
  const char* at = nullptr;
  int shift = 0;
  inline void step(int64_t k) const {
    if (at) __builtin_prefetch(at + (k >> shift) * 64, 0, 2);
  }
};

// The spacing of the next block's lines over `tiles` tiles of `steps` steps each: the sparsest
// (largest shift, at most AHEAD_MAX_SHIFT) at which the tiles still ask for all `lines`; 0 where
// even a line per step falls short (a few tiles: the rest come as the next panel's tiles run).
// Lines one tile of `steps` steps asks for, a new one every 2^shift steps.
static inline int64_t ahead_lines(int64_t steps, int shift) { return (steps + (int64_t(1) << shift) - 1) >> shift; }

static inline int ahead_shift(int64_t tiles, int64_t steps, int64_t lines) {
  int shift = 0;
  while (shift < AHEAD_MAX_SHIFT && tiles * ahead_lines(steps, shift + 1) >= lines) ++shift;
  return shift;
}

template <typename TB> static inline void prefetch_panel(const TB* row) {
#pragma GCC unroll 8
  for (int64_t byte = 0; byte < int64_t(NR * sizeof(TB)); byte += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + byte);
}

// A is read where it lies, R rows lda apart, each value broadcast: packing A into MR-row panels
// (as BLAS does) was measured no faster at M = 128 and costs a pass over A per thread, which at
// narrow N (a few panels per thread) was a fifth of the time.
static inline V broadcast(const float* a) { return *a - V{}; }  // x - 0 is x for every x; x + 0 is not, for -0
static inline V broadcast(const kiln_bf16* a) { return float(*a) - V{}; }

// acc += A [R rows, kc] @ B panel [kc, NR], the panel's first NVT vectors (fewer than NV: the last
// panel of an N that is not a multiple of NR). Fully unrolled over the register block, so the
// accumulators live in registers (-O2 does not unroll these loops by itself).
template <int R, int NVT, typename T>
static inline void micro_fma(V (&acc)[R][NV], int64_t kc, const T* a, int64_t lda, const T* bp, Ahead ahead) {
  // A block of fewer than 8 accumulators (1 or 2 rows: M = 1, a GEMV) would wait on the FMA's
  // latency (4 cycles, 2 FMAs a cycle): it keeps CHAINS sets, for k = 0, 1, ... mod CHAINS, added
  // at the end. (Its one-thread figures, 1x768x768 0.95-0.97x the time and 1x4096x4096 0.91x, were
  // timed with the old build first, a place M = 1 timings penalize by 4-13 %: docs/results.md.)
  constexpr int CHAINS = R * NVT >= 8 ? 1 : R * NVT >= 4 ? 2 : 4;
  V part[CHAINS][R][NV];
  constexpr int distance = CHAINS > 1 ? PREFETCH_GEMV : PREFETCH;
  auto step = [&](V (&sums)[R][NV], int64_t k) {
    if constexpr (distance > 0) prefetch_panel(bp + (k + distance) * NR);
    ahead.step(k);
    V b[NVT];
#pragma GCC unroll 8
    for (int v = 0; v < NVT; ++v) {
      if constexpr (std::is_same_v<T, float>) b[v] = kiln::load(bp + k * NR + v * L);
      else b[v] = kiln::load_bf16(bp + k * NR + v * L);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      V ar = broadcast(a + r * lda + k);
#pragma GCC unroll 8
      for (int v = 0; v < NVT; ++v) sums[r][v] = fma(ar, b[v], sums[r][v]);
    }
  };
  int64_t k = 0;
  if constexpr (CHAINS > 1) {
#pragma GCC unroll 4
    for (int c = 1; c < CHAINS; ++c)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) part[c][r][v] = V{};
    for (; k + CHAINS <= kc; k += CHAINS) {
      step(acc, k);
#pragma GCC unroll 4
      for (int c = 1; c < CHAINS; ++c) step(part[c], k + c);
    }
  }
  for (; k < kc; ++k) step(acc, k);
  if constexpr (CHAINS > 1) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NVT; ++v) {
        V rest = part[1][r][v];
#pragma GCC unroll 4
        for (int c = 2; c < CHAINS; ++c) rest += part[c][r][v];
        acc[r][v] += rest;
      }
  }
}

#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
// bfloat16 in pairs of k, the B panel [kc / 2][NR][2]: one vdpbf16ps adds a[k] * b[k] +
// a[k+1] * b[k+1] into float32 lanes. An odd kc's last pair (the last K block's) reads A's one
// value alone; its partner in the panel is zero.
template <int R, int NVT>
static inline void micro_pairs(V (&acc)[R][NV], int64_t kc, const kiln_bf16* a, int64_t lda, const kiln_bf16* bp,
                               Ahead ahead) {
  auto step = [&](int64_t kp, auto a_pair) {
    prefetch_panel(bp + (kp + PREFETCH) * NR * 2);
    ahead.step(kp);
    __m512bh b[NVT];
#pragma GCC unroll 8
    for (int v = 0; v < NVT; ++v) b[v] = (__m512bh)_mm512_loadu_si512(bp + (kp * NR + v * L) * 2);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m512bh ar = (__m512bh)_mm512_set1_epi32(a_pair(r));
#pragma GCC unroll 8
      for (int v = 0; v < NVT; ++v) acc[r][v] = (V)_mm512_dpbf16_ps((__m512)acc[r][v], ar, b[v]);
    }
  };
  const int64_t pairs = kc / 2;
  for (int64_t kp = 0; kp < pairs; ++kp)
    step(kp, [&](int r) { int32_t pair; std::memcpy(&pair, a + r * lda + 2 * kp, 4); return pair; });
  if (kc % 2) step(pairs, [&](int r) { return int32_t(a[r * lda + kc - 1].bits); });
}
#endif

// How a bfloat16 product of many rows (BF16_WIDEN_ROWS or more) is multiplied where the CPU has
// vdpbf16ps: BF16_DOT (vdpbf16ps in the tiles) or BF16_FMA (the panels widened to float32 block by
// block, WidenedPanels, and float32's tile), the faster measured once per process
// (bf16_fastest_product below), or BF16_AMX (kiln_gemm_amx.h) where the CPU has it; tests may force
// one (kiln_gemm_bf16_force_product). Fewer rows take AMX where it is the fastest, else vdpbf16ps
// (there the weight's bytes, not the products, bound them); one row always the GEMV.
enum Bf16Product { BF16_DOT = 0, BF16_FMA = 1, BF16_AMX = 2 };
static std::atomic<int> bf16_product_forced{-1};
constexpr int64_t BF16_WIDEN_ROWS = 32;

// kiln's own blocking on AVX-512 (not another one asked for to time it), unless KILN_GEMM_NO_ASM.
#if defined(__x86_64__) && KILN_VEC_BYTES == 64 && !defined(KILN_GEMM_MR) && !defined(KILN_GEMM_NO_ASM)
#define KILN_GEMM_WRITTEN_TILE 1
#endif

#ifdef KILN_GEMM_WRITTEN_TILE
// The tile of MR = 8 rows by NVT = 1, 2 or 3 vectors of a whole panel into float32 C, written out
// in assembly: the tile of nearly every call. In C++ (micro_fma, one step of k per iteration) the
// loop's counter and branch and the next block's prefetch arithmetic ran at every step, and the
// accumulators went through memory to the store; unrolled by 8 in C++, GCC moved accumulators
// between registers at every iteration (24 vmovaps) and kept the counter in memory. Here: 8 steps
// an iteration; the accumulators (acc[r][v] in zmm 8 + NVT r + v) start from zero or C's block
// and are stored to it without leaving the registers; over the last 8 iterations one row of C's
// block is asked for writing each, so that the stores find their lines in L1 (MKL's sgemm kernel
// does the same, seen in a profile). The same FMAs in the same order as micro_fma: the same sums.
// One thread of an Intel Xeon, against micro_fma (tile_rows inlined in both): 16384x16x64 0.74x,
// 4096x64x256 0.85x, 128x96x512 0.94x, 128x512x512 0.97x, 128x768x3072 0.98x (docs/gemm.md).
// A's rows 0-3 from a0 and 4-7 from a4, lda and 3 lda bytes apart; the panel's rows 192 bytes
// apart (NR floats; the last panel's beyond its NVT vectors are padding, not read).
// The tile's 8 rows for NVT = 1, 2, 3: ROWS<NVT>(M, u) is M(u, A, registers...) for each row, A
// its address in A (rows 0-3 from a0, 4-7 from a4) and the registers its accumulators.
#define KILN_GEMM_ROWS1(M, u)                                                                        \
  M(u, "(%[a0])", 8) M(u, "(%[a0],%[lda],1)", 9) M(u, "(%[a0],%[lda],2)", 10)                       \
  M(u, "(%[a0],%[lda3],1)", 11) M(u, "(%[a4])", 12) M(u, "(%[a4],%[lda],1)", 13)                    \
  M(u, "(%[a4],%[lda],2)", 14) M(u, "(%[a4],%[lda3],1)", 15)
#define KILN_GEMM_ROWS2(M, u)                                                                        \
  M(u, "(%[a0])", 8, 9) M(u, "(%[a0],%[lda],1)", 10, 11) M(u, "(%[a0],%[lda],2)", 12, 13)           \
  M(u, "(%[a0],%[lda3],1)", 14, 15) M(u, "(%[a4])", 16, 17) M(u, "(%[a4],%[lda],1)", 18, 19)        \
  M(u, "(%[a4],%[lda],2)", 20, 21) M(u, "(%[a4],%[lda3],1)", 22, 23)
#define KILN_GEMM_ROWS3(M, u)                                                                        \
  M(u, "(%[a0])", 8, 9, 10) M(u, "(%[a0],%[lda],1)", 11, 12, 13) M(u, "(%[a0],%[lda],2)", 14, 15, 16) \
  M(u, "(%[a0],%[lda3],1)", 17, 18, 19) M(u, "(%[a4])", 20, 21, 22)                                 \
  M(u, "(%[a4],%[lda],1)", 23, 24, 25) M(u, "(%[a4],%[lda],2)", 26, 27, 28)                         \
  M(u, "(%[a4],%[lda3],1)", 29, 30, 31)
// Step u of a row: A's value broadcast, one FMA per vector of the panel's row (zmm0-2).
#define KILN_GEMM_BCAST(u, A) "vbroadcastss 4*" #u A ", %%zmm3\n\t"
#define KILN_GEMM_FMA(v, z) "vfmadd231ps %%zmm" #v ", %%zmm3, %%zmm" #z "\n\t"
#define KILN_GEMM_FMA1(u, A, z0) KILN_GEMM_BCAST(u, A) KILN_GEMM_FMA(0, z0)
#define KILN_GEMM_FMA2(u, A, z0, z1) KILN_GEMM_FMA1(u, A, z0) KILN_GEMM_FMA(1, z1)
#define KILN_GEMM_FMA3(u, A, z0, z1, z2) KILN_GEMM_FMA2(u, A, z0, z1) KILN_GEMM_FMA(2, z2)
// Vector v of the panel's row of step u: asked for PREFETCH steps ahead, loaded into zmm v.
#define KILN_GEMM_B(u, v)                                                                            \
  "prefetcht0 %c[pf]+64*" #v "+192*" #u "(%[b])\n\t"                                                 \
  "vmovups 64*" #v "+192*" #u "(%[b]), %%zmm" #v "\n\t"
#define KILN_GEMM_STEP1(u) KILN_GEMM_B(u, 0) KILN_GEMM_ROWS1(KILN_GEMM_FMA1, u)
#define KILN_GEMM_STEP2(u) KILN_GEMM_B(u, 0) KILN_GEMM_B(u, 1) KILN_GEMM_ROWS2(KILN_GEMM_FMA2, u)
#define KILN_GEMM_STEP3(u) KILN_GEMM_B(u, 0) KILN_GEMM_B(u, 1) KILN_GEMM_B(u, 2) KILN_GEMM_ROWS3(KILN_GEMM_FMA3, u)
// A row of C's block at t to and from the accumulators (op: vmovups, or vmovntps to stream), then
// t on to the next row; the accumulators zeroed; C's row at c asked for writing.
#define KILN_GEMM_IN(v, z) "vmovups 64*" #v "(%[t]), %%zmm" #z "\n\t"
#define KILN_GEMM_OUT(op, v, z) op " %%zmm" #z ", 64*" #v "(%[t])\n\t"
#define KILN_GEMM_NEXT_ROW "add %[ldc], %[t]\n\t"
#define KILN_GEMM_ZERO(z) "vpxord %%zmm" #z ", %%zmm" #z ", %%zmm" #z "\n\t"
#define KILN_GEMM_IN1(op, A, z0) KILN_GEMM_IN(0, z0) KILN_GEMM_NEXT_ROW
#define KILN_GEMM_IN2(op, A, z0, z1) KILN_GEMM_IN(0, z0) KILN_GEMM_IN(1, z1) KILN_GEMM_NEXT_ROW
#define KILN_GEMM_IN3(op, A, z0, z1, z2) KILN_GEMM_IN(0, z0) KILN_GEMM_IN(1, z1) KILN_GEMM_IN(2, z2) KILN_GEMM_NEXT_ROW
#define KILN_GEMM_OUT1(op, A, z0) KILN_GEMM_OUT(op, 0, z0) KILN_GEMM_NEXT_ROW
#define KILN_GEMM_OUT2(op, A, z0, z1) KILN_GEMM_OUT(op, 0, z0) KILN_GEMM_OUT(op, 1, z1) KILN_GEMM_NEXT_ROW
#define KILN_GEMM_OUT3(op, A, z0, z1, z2)                                                            \
  KILN_GEMM_OUT(op, 0, z0) KILN_GEMM_OUT(op, 1, z1) KILN_GEMM_OUT(op, 2, z2) KILN_GEMM_NEXT_ROW
#define KILN_GEMM_ZERO1(u, A, z0) KILN_GEMM_ZERO(z0)
#define KILN_GEMM_ZERO2(u, A, z0, z1) KILN_GEMM_ZERO(z0) KILN_GEMM_ZERO(z1)
#define KILN_GEMM_ZERO3(u, A, z0, z1, z2) KILN_GEMM_ZERO(z0) KILN_GEMM_ZERO(z1) KILN_GEMM_ZERO(z2)
#define KILN_GEMM_ASK_C1 "prefetchw 0(%[c])\n\t"
#define KILN_GEMM_ASK_C2 KILN_GEMM_ASK_C1 "prefetchw 64(%[c])\n\t"
#define KILN_GEMM_ASK_C3 KILN_GEMM_ASK_C2 "prefetchw 128(%[c])\n\t"
#define KILN_GEMM_GROUP(STEP)                                                                       \
  STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7)                                   \
  "add $32, %[a0]\n\t"                                                                              \
  "add $32, %[a4]\n\t"                                                                              \
  "add $1536, %[b]\n\t"
// The next block's lines (Ahead) for the iteration's 8 steps: 4, `line` bytes apart, where `next`
// is not null.
#define KILN_GEMM_NEXT                                                                              \
  "test %[next], %[next]\n\t"                                                                       \
  "jz 5f\n\t"                                                                                       \
  "prefetcht1 (%[next])\n\t"                                                                        \
  "prefetcht1 (%[next],%[line],1)\n\t"                                                              \
  "prefetcht1 (%[next],%[line],2)\n\t"                                                              \
  "lea (%[next],%[line],2), %[t]\n\t"                                                               \
  "prefetcht1 (%[t],%[line],1)\n\t"                                                                 \
  "lea (%[next],%[line],4), %[next]\n\t"                                                            \
  "5:\n\t"
// The tile: C's block loaded (or zeros), the iterations without and with a row of C to ask for,
// the single steps, the block stored (or streamed).
#define KILN_GEMM_TILE(N)                                                                           \
  "mov %[c], %[t]\n\t"                                                                              \
  "cmpl $0, %[zero]\n\t"                                                                            \
  "jne 6f\n\t"                                                                                      \
  KILN_GEMM_ROWS##N(KILN_GEMM_IN##N, 0)                                                             \
  "jmp 7f\n\t"                                                                                      \
  "6:\n\t" KILN_GEMM_ROWS##N(KILN_GEMM_ZERO##N, 0)                                                  \
  "7:\n\t"                                                                                          \
  "test %[n], %[n]\n\t"                                                                             \
  "jle 2f\n\t"                                                                                      \
  "1:\n\t" KILN_GEMM_NEXT KILN_GEMM_GROUP(KILN_GEMM_STEP##N)                                        \
  "dec %[n]\n\t"                                                                                    \
  "jnz 1b\n\t"                                                                                      \
  "2:\n\t"                                                                                          \
  "mov %[tail], %[n]\n\t"                                                                           \
  "test %[n], %[n]\n\t"                                                                             \
  "jle 9f\n\t"                                                                                      \
  "3:\n\t" KILN_GEMM_NEXT KILN_GEMM_ASK_C##N                                                        \
  "add %[ldc], %[c]\n\t" KILN_GEMM_GROUP(KILN_GEMM_STEP##N)                                         \
  "dec %[n]\n\t"                                                                                    \
  "jnz 3b\n\t"                                                                                      \
  "9:\n\t"                                                                                          \
  "mov %[rest], %[n]\n\t"                                                                           \
  "test %[n], %[n]\n\t"                                                                             \
  "jle 4f\n\t"                                                                                      \
  "8:\n\t" KILN_GEMM_STEP##N(0)                                                                     \
  "add $4, %[a0]\n\t"                                                                               \
  "add $4, %[a4]\n\t"                                                                               \
  "add $192, %[b]\n\t"                                                                              \
  "dec %[n]\n\t"                                                                                    \
  "jnz 8b\n\t"                                                                                      \
  "4:\n\t"                                                                                          \
  "mov %[out], %[t]\n\t"                                                                            \
  "cmpl $0, %[stream]\n\t"                                                                          \
  "jne 10f\n\t"                                                                                     \
  KILN_GEMM_ROWS##N(KILN_GEMM_OUT##N, "vmovups")                                                    \
  "jmp 11f\n\t"                                                                                     \
  "10:\n\t" KILN_GEMM_ROWS##N(KILN_GEMM_OUT##N, "vmovntps")                                         \
  "11:\n\t"
// Every operand the assembly changes early-clobbered: c starts equal to out, and GCC, seeing equal
// inputs, gave the two one register (the final stores went to C's last row onwards).
#define KILN_GEMM_OPERANDS                                                                          \
  : [a0] "+&r"(a0), [a4] "+&r"(a4), [b] "+&r"(b), [n] "+&r"(n), [next] "+&r"(next), [c] "+&r"(c), [t] "=&r"(t) \
  : [out] "r"(out), [lda] "r"(lda_bytes), [lda3] "r"(3 * lda_bytes), [line] "r"(line), [ldc] "r"(ldc_bytes), \
    [rest] "m"(rest), [tail] "m"(tail), [zero] "m"(zero), [stream] "m"(streamed), [pf] "i"(PREFETCH * NR * 4) \
  : "xmm0", "xmm1", "xmm2", "xmm3", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", \
    "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", \
    "xmm28", "xmm29", "xmm30", "xmm31", "memory", "cc"
static_assert(NR == 48 && MR == 8, "the written-out tile is 8 rows of up to 48 columns");

// C's block at `out` (float32, rows ldc floats apart) = (first ? 0 : C's block) + A [8 rows, kc]
// @ panel [kc, NVT vectors], kc >= 8, stored bypassing the caches where `stream`. `ahead` as
// micro_fma's, but 4 lines an iteration (steps 0, 2, 4, 6): where it asks for a line every step (a
// few tiles for a large block), half of them.
template <int NVT>
[[gnu::always_inline]] static inline void tile_8_written(bool first, int64_t kc, const float* a, int64_t lda,
                                                         const float* b, Ahead ahead, float* out, int64_t ldc,
                                                         bool stream) {
  const char* a0 = reinterpret_cast<const char*>(a);
  const char* a4 = a0 + 4 * lda * int64_t(sizeof(float));
  const int64_t lda_bytes = lda * int64_t(sizeof(float)), ldc_bytes = ldc * int64_t(sizeof(float));
  // Ahead's lines (k >> shift) for k = 0, 2, 4, 6 of each iteration: 128 >> shift bytes apart.
  const char* next = ahead.at;
  const int64_t line = int64_t(128) >> ahead.shift;
  // Iterations without and with a row of C to ask for (`tail`: all 8 rows from kc = 64; none where
  // C is streamed), then single steps (`rest`).
  const int64_t tail = stream ? 0 : std::min<int64_t>(kc / 8, 8), rest = kc % 8;
  int64_t n = kc / 8 - tail, t;
  const int32_t zero = first, streamed = stream;
  const char* c = reinterpret_cast<const char*>(out);  // C's rows as they are asked for
  if constexpr (NVT == 3) asm volatile(KILN_GEMM_TILE(3) KILN_GEMM_OPERANDS);
  else if constexpr (NVT == 2) asm volatile(KILN_GEMM_TILE(2) KILN_GEMM_OPERANDS);
  else asm volatile(KILN_GEMM_TILE(1) KILN_GEMM_OPERANDS);
}
#undef KILN_GEMM_GROUP
#undef KILN_GEMM_NEXT
#undef KILN_GEMM_TILE
#undef KILN_GEMM_OPERANDS
#undef KILN_GEMM_ROWS1
#undef KILN_GEMM_ROWS2
#undef KILN_GEMM_ROWS3
#undef KILN_GEMM_BCAST
#undef KILN_GEMM_FMA
#undef KILN_GEMM_FMA1
#undef KILN_GEMM_FMA2
#undef KILN_GEMM_FMA3
#undef KILN_GEMM_B
#undef KILN_GEMM_STEP1
#undef KILN_GEMM_STEP2
#undef KILN_GEMM_STEP3
#undef KILN_GEMM_IN
#undef KILN_GEMM_OUT
#undef KILN_GEMM_NEXT_ROW
#undef KILN_GEMM_ZERO
#undef KILN_GEMM_IN1
#undef KILN_GEMM_IN2
#undef KILN_GEMM_IN3
#undef KILN_GEMM_OUT1
#undef KILN_GEMM_OUT2
#undef KILN_GEMM_OUT3
#undef KILN_GEMM_ZERO1
#undef KILN_GEMM_ZERO2
#undef KILN_GEMM_ZERO3
#undef KILN_GEMM_ASK_C1
#undef KILN_GEMM_ASK_C2
#undef KILN_GEMM_ASK_C3
#endif

// `ahead`: memory to bring into L2 meanwhile (the next panel's block: a weight too large for the
// caches comes from DRAM, and its first tile would wait on every line).
template <int R, int NVT, typename T>
static inline void micro(V (&acc)[R][NV], int64_t kc, const T* a, int64_t lda, const T* bp, Ahead ahead) {
#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
  if constexpr (std::is_same_v<T, kiln_bf16>) return micro_pairs<R, NVT>(acc, kc, a, lda, bp, ahead);
#endif
  micro_fma<R, NVT>(acc, kc, a, lda, bp, ahead);
}

// The epilogue of `e` over a whole R x NVT-vector block of float32 C at c (rows ldc apart; C's
// columns from j0, rows from i0), in place, just stored and in L1: bias, residual, unary op. Its
// own function, one loop per unary op (with_unary): checked per vector in the tile's store, as a
// ragged edge's are, the steps cost ~10 uops a vector and the unary op a call (ReLU after a
// 16384x32x128 GEMM took 1.64 ms against 1.21 without, one thread of an Intel Xeon).
template <int R, int NVT>
[[gnu::noinline]] static void epilogue_in_place(float* c, int64_t ldc, int64_t i0, int64_t j0, const Epilogue& e) {
  V bias[NVT];  // without one, -0: x + -0 is x for every x (x + 0 is not, for -0)
#pragma GCC unroll 8
  for (int v = 0; v < NVT; ++v)
    bias[v] = e.bias ? load_n(at(e.bias, e.bias_bf16, j0 + v * L), e.bias_bf16, L) : kiln::splat(-0.0f);
  const void* residual = e.residual ? at(e.residual, e.residual_bf16, i0 * e.ld_residual + j0) : nullptr;
  with_unary(e.unary, [&](auto op) {
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NVT; ++v) {
        const void* residual_rv = residual ? at(residual, e.residual_bf16, r * e.ld_residual + v * L) : nullptr;
        V y = residual_and_op<decltype(op)::value>(kiln::load(c + r * ldc + v * L) + bias[v], residual_rv, L, e);
        kiln::store(c + r * ldc + v * L, y);
      }
  });
}

// The block's vectors stored as they are. Not inlined, acc by reference as store_block takes it:
// stored in the tile instead, with the accumulators left in registers, GEMMs of K = 16-64 measured
// 5-15 % slower (16384x32x128, 4096x64x256 on one thread of an Intel Xeon; the tile's code grows).
template <int R, int NVT> [[gnu::noinline]] static void store_plain(V (&acc)[R][NV], float* out, int64_t ldc, bool stream) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NVT; ++v) {
      if (stream) kiln::store_stream(out + r * ldc + v * L, acc[r][v]);
      else kiln::store(out + r * ldc + v * L, acc[r][v]);
    }
}

template <int R, int NVT, typename T>
static inline void tile(int rows, int cols, int64_t kc, bool first, bool last, const T* a, int64_t lda, const T* bp,
                        void* c, int64_t ldc, int64_t i0, int64_t j0, const Epilogue* e, Ahead ahead,
                        bool stream = false) {
#ifdef KILN_GEMM_WRITTEN_TILE
  // Whole vectors of a panel into float32 C: the written-out tile, the epilogue after.
  if constexpr (R == MR && std::is_same_v<T, float>) {
    if (kc >= 8 && cols == NVT * L && !(last && e && e->out_bf16)) {
      float* out = static_cast<float*>(c) + i0 * ldc + j0;
      tile_8_written<NVT>(first, kc, a, lda, bp, ahead, out, ldc, stream);
      if (last && e && (e->bias || e->unary || e->residual)) epilogue_in_place<R, NVT>(out, ldc, i0, j0, *e);
      return;
    }
  }
#endif
  V acc[R][NV];
  if (first) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  } else {  // a later K block: C holds float32 partial sums
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[r][v] = load_n(static_cast<const float*>(c) + (i0 + r) * ldc + j0 + v * L, false,
                           std::max(0, std::min(L, cols - v * L)));
  }
  micro<R, NVT>(acc, kc, a, lda, bp, ahead);
  const bool epilogue = last && e && (e->bias || e->unary || e->residual);
  if (cols != NVT * L || (last && e && e->out_bf16)) return store_block<R>(acc, rows, cols, i0, j0, c, ldc, e, last);
  float* out = static_cast<float*>(c) + i0 * ldc + j0;
  store_plain<R, NVT>(acc, out, ldc, stream);
  if (epilogue) epilogue_in_place<R, NVT>(out, ldc, i0, j0, *e);
}

// One tile of `rows` <= MR: the micro-kernel instantiated for exactly that many rows. Inlined
// into gemm, always: called, it took the Ahead struct, written by gemm as a pointer and an int,
// as one 16-byte load, which waits for every store before it to reach L1 (store forwarding fails)
// - the previous tile's stores of C, from L2 - and GCC's choice flipped with unrelated code
// (16384x16x64: 0.72x against 1.0x the time of the C++ kernel's build, one thread).
template <int R = MR, typename T>
[[gnu::always_inline]] static inline void tile_rows(int rows, int cols, int64_t kc, bool first, bool last,
                                                    const T* a, int64_t lda, const T* bp, void* c, int64_t ldc,
                                                    int64_t i0, int64_t j0, const Epilogue* e, Ahead ahead,
                                                    bool stream = false) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows<R - 1>(rows, cols, kc, first, last, a, lda, bp, c, ldc, i0, j0, e, ahead, stream);
  }
  // The last panel of an N that is not a multiple of NR, in whole row blocks: only the vectors that
  // hold columns (N = 64 in panels of 48: a third of the FMAs were on the zero padding).
  if constexpr (R == MR) {
    if (cols <= L) return tile<R, 1>(rows, cols, kc, first, last, a, lda, bp, c, ldc, i0, j0, e, ahead);
    if constexpr (NV >= 3)
      if (cols <= 2 * L) return tile<R, 2>(rows, cols, kc, first, last, a, lda, bp, c, ldc, i0, j0, e, ahead);
  }
  tile<R, NV>(rows, cols, kc, first, last, a, lda, bp, c, ldc, i0, j0, e, ahead, stream);
}

// Whether panels of T hold k in pairs (bfloat16 with the pair dot products).
template <typename T> constexpr bool in_pairs = std::is_same_v<T, kiln_bf16> && BF16_PAIRS;
static inline int64_t round_even(int64_t k) { return (k + 1) / 2 * 2; }

// Elements of B's packed form: ceil(N / NR) panels of K x NR (bfloat16 pairs: K rounded up to even).
template <typename T> static inline int64_t packed_elements(int64_t K, int64_t N) {
  return (N + NR - 1) / NR * (in_pairs<T> ? round_even(K) : K) * NR;
}

// Pack B [K, N] (element strides sk, sn) into panels, zero-padded.
template <typename T>
static void pack_b(const T* b, int64_t K, int64_t N, int64_t sk, int64_t sn, T* out) {
  const int64_t panels = (N + NR - 1) / NR, rows = in_pairs<T> ? round_even(K) : K;
#pragma omp parallel for num_threads(kiln::team())
  for (int64_t p = 0; p < panels; ++p) {
    T* dst = out + p * rows * NR;
    const int64_t j0 = p * NR, n = std::min<int64_t>(NR, N - j0);
    for (int64_t k = 0; k < rows; ++k) {
      for (int64_t j = 0; j < NR; ++j) {
        const T value = (k < K && j < n) ? b[k * sk + (j0 + j) * sn] : T(0.0f);
        if constexpr (in_pairs<T>) dst[((k / 2) * NR + j) * 2 + (k % 2)] = value;
        else dst[k * NR + j] = value;
      }
    }
  }
}

// A [M, K] (row stride lda) of float32 as a bfloat16 copy [M, K], row-major, rounded to nearest
// even: the "packing" of A for bfloat16 fast math (a float32 model's product over bfloat16 panels
// of its weight; backend.fp32_gemm, docs/gemm.md), so that the micro-kernel reads A as it reads a
// bfloat16 model's (in pairs of k with avx512_bf16). One pass over A, against the product's K / 1
// FMAs per element of it; the threads woken only where A is large enough to pay for them.
static void convert_a_bf16(int64_t M, int64_t K, const float* a, int64_t lda, kiln_bf16* out) {
  const int64_t whole = K / L * L;
#pragma omp parallel for if (M * K >= (int64_t(1) << 16)) num_threads(kiln::team())
  for (int64_t i = 0; i < M; ++i) {
    const float* row = a + i * lda;
    kiln_bf16* dst = out + i * K;
    int64_t k = 0;
    for (; k < whole; k += L) kiln::store_bf16(dst + k, kiln::load(row + k));
    for (; k < K; ++k) dst[k] = kiln_bf16(row[k]);
  }
}

static inline void range(int64_t total, int parts, int index, int64_t& lo, int64_t& hi) {
  const int64_t base = total / parts, extra = total % parts;
  lo = index * base + std::min<int64_t>(index, extra);
  hi = lo + base + (index < extra ? 1 : 0);
}

// The thread grid: `tn` threads along the panels and `tm` along the row blocks, tn * tm = threads.
// Panels by preference (a weight panel read by one thread only), rows where that balances the
// work better (five panels on two threads: 3 + 2). Work counted in vectors of tiles: the last
// panel has `last_vectors` of NV (N = 64 on two threads by panels: one thread 3 vectors, the other
// 1; 16384x16x64 took 0.32-0.39 ms there against 0.27 on one thread).
static inline void split(int64_t panels, int64_t row_blocks, int last_vectors, int threads, int& tn, int& tm) {
  // The grid whose busiest thread has the fewest vector-tiles; among equals, the most threads on panels.
  auto busiest = [&](int n, int m) {
    int64_t most = 0, lo, hi;
    for (int i = 0; i < n; ++i) {
      range(panels, n, i, lo, hi);
      most = std::max<int64_t>(most, (hi - lo) * NV - (hi == panels && hi > lo ? NV - last_vectors : 0));
    }
    return most * ((row_blocks + m - 1) / m);
  };
  tn = threads, tm = 1;
  int64_t best = busiest(threads, 1);
  for (int n = threads - 1; n >= 1; --n) {
    if (threads % n) continue;
    const int m = threads / n;
    const int64_t work = busiest(n, m);
    if (work < best) best = work, tn = n, tm = m;
  }
}

// The calling thread's panels [p0, p1) and row blocks [r0, r1) in the grid `split` makes for its
// team (inside a parallel region). `made_panels`: each thread makes the panels it reads (a
// quantized weight's, dequantized per call), so the threads split the panels wherever there are
// enough: splitting the rows would have every thread make every panel.
struct ThreadShare { int64_t p0, p1, r0, r1; };
static inline ThreadShare thread_share(int64_t N, int64_t panels, int64_t row_blocks, bool made_panels = false) {
  int tn, tm;
  const int threads = omp_get_num_threads();
  if (made_panels && panels >= threads) tn = threads, tm = 1;
  else split(panels, row_blocks, int((N - (panels - 1) * NR + L - 1) / L), threads, tn, tm);
  const int id = omp_get_thread_num();
  ThreadShare share;
  range(panels, tn, id % tn, share.p0, share.p1);
  range(row_blocks, tm, id / tn, share.r0, share.r1);
  return share;
}

// Rows [r0, r1) of a float32 C [., N] as layer norm makes them: mean and variance over the row
// (two passes over the row, which is in L1/L2: just stored), then (x - mean) * rstd * w + b,
// written over the row or, where the sum is needed too (a pre-norm model's residual stream), to
// e.norm_out. An RMS norm (RMS_NORM) takes the mean of squares about zero: one pass.
// Lanes accumulate separately and are summed at the end, as a vectorized reduction kernel does;
// four vectors of them, so that the adds of a row do not wait on each other (one accumulator made
// the norm of BERT's 128 x 768 rows 47 us on one thread, most of it add latency).
// `combine` folds vectors and floats alike (a sum; the softmax's max), starting from `start`.
template <typename F, typename C>
static inline float row_reduce(const float* row, int64_t N, float start, F&& term, C&& combine) {
  const int64_t whole = N / L * L;
  V acc[4] = {V{} + start, V{} + start, V{} + start, V{} + start};
  int64_t j = 0;
  for (; j + 4 * L <= whole; j += 4 * L)
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) acc[u] = combine(acc[u], term(kiln::load(row + j + u * L)));
  for (; j < whole; j += L) acc[0] = combine(acc[0], term(kiln::load(row + j)));
  V both = combine(combine(acc[0], acc[1]), combine(acc[2], acc[3]));
  float lanes[L];
  std::memcpy(lanes, &both, sizeof lanes);
#pragma GCC unroll 16
  for (int width = L / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] = combine(lanes[l], lanes[l + width]);
  float total = lanes[0];
  for (; j < N; ++j) total = combine(total, term(V{} + row[j])[0]);
  return total;
}

template <typename F> static inline float row_sum(const float* row, int64_t N, F&& term) {
  return row_reduce(row, N, 0.0f, term, [](auto x, auto y) { return x + y; });
}

// Where element j of row i's norm goes: e.norm_out's row (float32 or bfloat16), or C's own row.
static inline void* normed_at(const Epilogue& e, float* row, int64_t i, int64_t j) {
  if (!e.norm_out) return row + j;
  return const_cast<void*>(at(e.norm_out, e.norm_out_bf16, i * e.ld_norm_out + j));
}

static inline void layer_norm_rows(float* c, int64_t ldc, int64_t N, int64_t r0, int64_t r1, const Epilogue& e) {
  for (int64_t i = r0; i < r1; ++i) {
    float* row = c + i * ldc;
    const float mean = e.row_norm == RMS_NORM ? 0.0f : row_sum(row, N, [](V x) { return x; }) / float(N);
    const float var = row_sum(row, N, [mean](V x) { V d = x - mean; return d * d; });
    const float rstd = 1.0f / std::sqrt(var / float(N) + e.norm_eps);
    const bool bf16 = e.norm_out_bf16;
    for (int64_t j = 0; j < N; j += L) {
      const int n = int(std::min<int64_t>(L, N - j));
      V y = (load_n(row + j, false, n) - mean) * rstd;
      if (e.norm_weight) y *= load_n(e.norm_weight + j, false, n);
      if (e.norm_bias) y += load_n(e.norm_bias + j, false, n);
      store_n(normed_at(e, row, i, j), bf16, y, n);
      if (e.sum_out) store_n(static_cast<kiln_bf16*>(e.sum_out) + i * e.ld_sum_out + j, true, load_n(row + j, false, n), n);
    }
  }
}

// Rows [r0, r1) of a float32 C as softmax (or log-softmax) over each makes them: the row's max,
// then exp(x - max) stored while it is summed (the row in L1/L2, just stored, as for the norms),
// then a pass that scales the stored exponentials by 1 / sum (log-softmax: stores nothing in the
// second pass, x - max - log(sum) in the third). One exponential an element; two into bfloat16
// rows, which would round the exponentials before their scaling.
static inline void softmax_rows(float* c, int64_t ldc, int64_t N, int64_t r0, int64_t r1, const Epilogue& e) {
  auto larger = [](auto x, auto y) {
    if constexpr (std::is_same_v<decltype(x), float>) return kiln_max(x, y);
    else return kiln::vmax(x, y);
  };
  const bool log = e.row_norm == LOG_SOFTMAX, bf16 = e.norm_out_bf16, keep_exps = !log && !bf16 && !e.sum_out;
  for (int64_t i = r0; i < r1; ++i) {
    float* row = c + i * ldc;
    float* exps = keep_exps ? static_cast<float*>(normed_at(e, row, i, 0)) : nullptr;
    const float top = row_reduce(row, N, -INFINITY, [](V x) { return x; }, larger);
    V sums[2] = {};
    int64_t j = 0;
    for (; j + L <= N; j += L) {
      const V ex = kiln_vexp(kiln::load(row + j) - top);
      if (keep_exps) kiln::store(exps + j, ex);
      sums[(j / L) & 1] += ex;
    }
    float total = row_sum(reinterpret_cast<const float*>(sums), 2 * L, [](V x) { return x; });
    for (; j < N; ++j) {
      const float ex = std::exp(row[j] - top);
      if (keep_exps) exps[j] = ex;
      total += ex;
    }
    const float shift = top + std::log(total), scale = 1.0f / total;
    if (keep_exps) {
      for (j = 0; j + L <= N; j += L) kiln::store(exps + j, kiln::load(exps + j) * scale);
      for (; j < N; ++j) exps[j] *= scale;
      continue;
    }
    for (j = 0; j < N; j += L) {
      const int n = int(std::min<int64_t>(L, N - j));
      const V x = load_n(row + j, false, n);
      store_n(normed_at(e, row, i, j), bf16, log ? x - shift : kiln_vexp(x - top) * scale, n);
      if (e.sum_out) store_n(static_cast<kiln_bf16*>(e.sum_out) + i * e.ld_sum_out + j, true, x, n);
    }
  }
}

// Thread `id` of `threads`' share of C's rows through the epilogue's row norm (e.row_norm), once
// every thread has stored its tiles.
static inline void norm_rows(float* c, int64_t ldc, int64_t M, int64_t N, const Epilogue& e, int id, int threads) {
  int64_t n0, n1;
  range(M, threads, id, n0, n1);
  if (e.row_norm == SOFTMAX || e.row_norm == LOG_SOFTMAX) softmax_rows(c, ldc, N, n0, n1, e);
  else layer_norm_rows(c, ldc, N, n0, n1, e);
}

// A one-row product (a decode step's GEMV) reads its weight once, from DRAM: its speed is the
// memory's, and one core's is set by how many lines it has in flight. A thread streaming its panels
// one after another is one stream, which the hardware prefetcher follows a page at a time; the
// same thread reading several places at once keeps more lines in flight (a plain read of 400 MB on
// 2 threads of an Intel Xeon: 24 GB/s as one stream a thread, 31-32 as four or eight). The thread's
// panels are cut into GEMV_STREAMS runs, and step k reads row k of the next panel of each run: as
// many panels as a tile has rows, the accumulators the register file holds (MR x NV). From DRAM,
// against one panel at a time (2 threads of an Intel Xeon, M = 1, GB/s): 768x2304 29.2 -> 30.4-32.3,
// 768x768 26.2 -> 29.8-31.5, 2048x768 27.4 -> 30.6-31.5, 768x32000 29.0 -> 32.1-32.7 (4 runs: about
// half the gain; software prefetches on top of the runs: no change).
#ifdef KILN_GEMM_GEMV_STREAMS  // to time another count
constexpr int GEMV_STREAMS = KILN_GEMM_GEMV_STREAMS;
#else
constexpr int GEMV_STREAMS = MR;
#endif

// Every vector of x set to zero.
template <int A, int B> static inline void clear(V (&x)[A][B]) {
#pragma GCC unroll 8
  for (int a = 0; a < A; ++a)
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) x[a][b] = V{};
}

// acc[s] = a [1, K] @ panel s (K rows of NR), for S panels at once; each row's lines asked for
// into L1 NEAR rows ahead (prefetcht0; 0: not asked for).
template <int S, int NEAR = 0>
static inline void gemv_panels(int64_t K, const float* a, const float* const* panels, V (&acc)[S][NV]) {
  clear(acc);
  for (int64_t k = 0; k < K; ++k) {
    const V x = broadcast(a + k);
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        if constexpr (NEAR > 0) __builtin_prefetch(panels[s] + (k + NEAR) * NR + v * L, 0, 3);
        acc[s][v] = fma(x, kiln::load(panels[s] + k * NR + v * L), acc[s][v]);
      }
  }
}

// f(count) with count = std::integral_constant<int, n>, n in 1..S: a run-time count of panels as
// a compile-time one (the accumulators' array bound).
template <int S, typename F> static inline void with_count(int n, F&& f) {
  if constexpr (S > 1) {
    if (n < S) return with_count<S - 1>(n, f);
  }
  f(std::integral_constant<int, S>{});
}

// Panels [p0, p1) cut into `runs` runs of equal length (to one) are read in this many steps: the
// first run's length.
static inline int64_t run_steps(int64_t p0, int64_t p1, int runs) { return (p1 - p0 + runs - 1) / runs; }

// Step i of panel_runs over [p0, p1): f(count, at) with the i-th panel of every run that has one,
// at[0, count).
template <int RUNS, typename F> static inline void run_step(int64_t p0, int64_t p1, int64_t i, F&& f) {
  int64_t at[RUNS];
  int n = 0;
  for (int g = 0; g < RUNS; ++g) {
    int64_t lo, hi;
    range(p1 - p0, RUNS, g, lo, hi);
    if (lo + i < hi) at[n++] = p0 + lo + i;
  }
  with_count<RUNS>(n, [&](auto count) { f(count, at); });
}

// Panels [p0, p1) cut into RUNS runs of equal length (to one), read side by side: a step at a time.
template <int RUNS = GEMV_STREAMS, typename F> static inline void panel_runs(int64_t p0, int64_t p1, F&& f) {
  for (int64_t i = 0, steps = run_steps(p0, p1, RUNS); i < steps; ++i) run_step<RUNS>(p0, p1, i, f);
}

// f(threads, thread) on each thread of a parallel region (of `threads`; 0: kiln::team()) where
// `parallel`, else f(1, 0) on this thread with no region at all: under a false `if` libgomp still
// makes and frees a team (a ~2 KB malloc, which has glibc consolidate its freed small chunks first)
// and ends it with a barrier's wake.
template <typename F> static inline void parallel_team(bool parallel, F&& f, int threads = 0) {
  if (!parallel) return f(1, 0);
#pragma omp parallel num_threads(threads > 0 ? threads : kiln::team())
  f(omp_get_num_threads(), omp_get_thread_num());
}

// One product's temporary memory on this thread (a decode step's activation digits, its padded
// row), 64-byte aligned: a block the thread keeps for the next product of the same `Kind` (a tag
// type). From malloc, each was ~1-20 KB a product, and a request of 1 KB or more makes glibc
// consolidate every small chunk freed since into its bins first (the C++ wrapper's handles: ~600
// a step): perf on a Qwen2-0.5B-shaped int4 decode step counted ~9 % of the calling thread in
// malloc and free, a third of it consolidating. Above SCRATCH_KEPT_BYTES (a prompt's rows), or
// where the kind's block is in use further up this thread's stack, the memory is allocated and
// freed with the product, as before.
constexpr int64_t SCRATCH_KEPT_BYTES = int64_t(256) << 10;

template <typename Kind> class Scratch {
 public:
  explicit Scratch(int64_t bytes) {
    const int64_t rounded = std::max<int64_t>(64, (bytes + 63) / 64 * 64);
    Kept& kept = kept_block();
    if (rounded <= SCRATCH_KEPT_BYTES && !kept.busy) {
      if (kept.bytes < rounded) {
        std::free(kept.block);
        kept.bytes = 0;
        if ((kept.block = std::aligned_alloc(64, rounded)) == nullptr) throw std::bad_alloc();
        kept.bytes = rounded;
      }
      kept.busy = true;
      data_ = kept.block;
      kept_ = true;
    } else if ((data_ = std::aligned_alloc(64, rounded)) == nullptr) {
      throw std::bad_alloc();
    }
  }
  Scratch(Scratch&& other) noexcept : data_(other.data_), kept_(other.kept_) {
    other.data_ = nullptr;
    other.kept_ = false;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch& operator=(Scratch&&) = delete;
  ~Scratch() {
    if (kept_) kept_block().busy = false;
    else std::free(data_);
  }
  // The memory from byte `offset` on, as T.
  template <typename T> T* at(int64_t offset) const { return reinterpret_cast<T*>(static_cast<char*>(data_) + offset); }

 private:
  struct Kept {
    void* block = nullptr;
    int64_t bytes = 0;
    bool busy = false;
    ~Kept() { std::free(block); }
  };
  static Kept& kept_block() {
    static thread_local Kept kept;
    return kept;
  }
  void* data_ = nullptr;
  bool kept_ = false;
};

// (tests) Scratch's blocks of `bytes`: out[0] one, out[1] one made while out[0]'s is held (a product
// inside a product), out[2] one made once both are gone.
static void scratch_blocks(int64_t bytes, void** out) {
  struct TestKind;
  {
    const Scratch<TestKind> first(bytes), second(bytes);
    out[0] = first.at<char>(0);
    out[1] = second.at<char>(0);
  }
  const Scratch<TestKind> third(bytes);
  out[2] = third.at<char>(0);
}

// A one-row product's panels shared out so that no thread waits on another at the end: each of
// `threads` owns a contiguous share (as `range` cuts them) and takes it from the front in chunks,
// one stream for the hardware's prefetcher; a thread done with its own then takes chunks from the
// back of the others'. A static split leaves one thread idle wherever the other's share runs late
// (a busy neighbour on the host, the memory's own unevenness): a llama-160m step's 49 int4
// products from DRAM, 2 threads of a 2-core AMD EPYC (Zen 4), the earlier thread waited 4-20 % of
// the products' time. A share's ends are one word (front | back << 32), taken by compare-and-swap.
class SharedPanels {
 public:
  SharedPanels(int64_t panels, int threads)
      : threads_(threads), chunk_(std::max<int64_t>(1, panels / (int64_t(threads) * 8))),
        memory_(threads * int64_t(sizeof(Share))), shares_(memory_.at<Share>(0)) {
    for (int t = 0; t < threads; ++t) {
      int64_t lo, hi;
      range(panels, threads, t, lo, hi);
      new (&shares_[t]) Share{};
      shares_[t].ends.store(uint64_t(lo) | uint64_t(hi) << 32, std::memory_order_relaxed);
    }
  }
  int threads() const { return threads_; }
  // f(p0, p1) over chunks of panels until none is left: thread t's own share, then the others'.
  template <typename F> void take_all(int t, F&& f) {
    int64_t p0, p1;
    while (take(shares_[t], chunk_, true, p0, p1)) f(p0, p1);
    for (int o = 1; o < threads_; ++o)
      while (take(shares_[(t + o) % threads_], std::max<int64_t>(1, chunk_ / 2), false, p0, p1)) f(p0, p1);
  }

 private:
  struct alignas(64) Share {
    std::atomic<uint64_t> ends{0};
  };
  static bool take(Share& share, int64_t n, bool front, int64_t& p0, int64_t& p1) {
    uint64_t ends = share.ends.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t lo = int64_t(ends & 0xFFFFFFFFu), hi = int64_t(ends >> 32);
      if (lo >= hi) return false;
      p0 = front ? lo : std::max(lo, hi - n);
      p1 = front ? std::min(hi, lo + n) : hi;
      const uint64_t rest = front ? uint64_t(p1) | uint64_t(hi) << 32 : uint64_t(lo) | uint64_t(p0) << 32;
      if (share.ends.compare_exchange_weak(ends, rest, std::memory_order_relaxed)) return true;
    }
  }
  int threads_;
  int64_t chunk_;
  Scratch<SharedPanels> memory_;  // (an aligned new and delete a product before)
  Share* shares_;
};

// (tests) `panels` shared by `threads` and taken by a team of `team`, thread 0 starting only once
// every other thread is done where `late`: counts[p] the times panel p was taken, taken[t] the
// panels thread t took.
static void shared_panels_take(int64_t panels, int threads, int team, bool late, int32_t* counts, int64_t* taken) {
  SharedPanels shared(panels, threads);
  std::atomic<int> done{0};
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
    if (t == 0 && late)
      while (done.load() < omp_get_num_threads() - 1) std::this_thread::yield();
    shared.take_all(t, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
#pragma omp atomic
        counts[p] += 1;
      }
      taken[t] += p1 - p0;
    });
    done.fetch_add(1);
  }
}

// Row 0 of C over panel `p` from its accumulators, through the epilogue.
static inline void store_row(const V (&acc)[NV], int64_t N, int64_t p, void* c, int64_t ldc, const Epilogue* e,
                             bool stream = false) {
  V one[1][NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) one[0][v] = acc[v];
  store_block<1>(one, 1, int(std::min<int64_t>(NR, N - p * NR)), 0, p * NR, c, ldc, e, true, stream);
}

#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
// acc[s] = a [1, K] @ panel s, bfloat16 in pairs of k ([K / 2][NR][2], micro_pairs' layout): one
// vdpbf16ps per vector of a pair row. An odd K's last pair reads a's last value alone (its partner
// in the panel is zero). Each pair row's lines asked for into L1 NEAR pair rows ahead, as float32's
// rows are (0: not asked for).
template <int S, int NEAR = 0>
static inline void gemv_panels(int64_t K, const kiln_bf16* a, const kiln_bf16* const* panels, V (&acc)[S][NV]) {
  clear(acc);
  auto step = [&](int64_t kp, int32_t pair) {
    const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        if constexpr (NEAR > 0) __builtin_prefetch(panels[s] + ((kp + NEAR) * NR + v * L) * 2, 0, 3);
        acc[s][v] = (V)_mm512_dpbf16_ps((__m512)acc[s][v], x, (__m512bh)_mm512_loadu_si512(panels[s] + (kp * NR + v * L) * 2));
      }
  };
  const int64_t pairs = K / 2;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    int32_t pair;
    std::memcpy(&pair, a + 2 * kp, 4);
    step(kp, pair);
  }
  if (K % 2) step(pairs, int32_t(a[K - 1].bits));
}
#endif

// Whether the panels lie on 2 MB pages (kiln's packs where transparent huge pages are on, on AMD:
// kiln_runtime.cpp `pack_empty`), set by the runtime (kiln_gemm_set_huge_page_packs): one-row
// products then read fewer runs a thread (2 here; the quantized products' digits 1: kiln_gemm_quant.h). The runs above keep lines in flight across the 4 KB pages where a stream's
// prefetches stop; on 2 MB pages one stream a thread goes on, and many compete. A llama-160m decode
// step's float32 products cycled from DRAM (2 threads of a 2-core AMD EPYC, Zen 4; 13 interleaved
// rounds; GB/s): 4 KB pages, 8 runs (MR) 45.5 (2 runs 38.4, 1 run 33.6); 2 MB pages, 8 runs 51.8, 2 runs
// 60.0, 1 run 59.2 — in an hour where memory was slow, 33.6, 34.3 and 34.8. An Intel Xeon with AMX
// (family 6 model 167) reads GEMV_STREAMS runs faster over 2 MB pages too (2 runs: 1.03-1.05x the
// time; docs/gemm.md): there the runtime reads them otherwise (`near_gemv`, below).
static std::atomic<bool> huge_page_packs{false};

// Whether float32's and bfloat16 pairs' one-row products over panels on 2 MB pages read them in NEAR_RUNS runs a thread,
// each row's lines asked for into L1 NEAR_ROWS rows (768 bytes) ahead: set by the runtime
// (kiln_gemm_set_near_gemv) where the packs lie on 2 MB pages of an Intel CPU, as the quantized
// products' runs read there (kiln_gemm_quant.h NEAR_UNITS: the L1's own prefetcher did not bring
// the runs' lines from L2 in time). An Intel Xeon with AMX (family 6 model 167), Qwen2-0.5B's step's
// float32 products cycled from DRAM (2 threads, benchmarks/tools/quant_decode_sweep.py
// --huge-page-runs --in-c, 8-12 interleaved rounds, the median of the rounds' ratios): 0.918x,
// 0.920x and 0.924x the time of 8 runs (MR) without (34.1 GB/s where kiln's line reader read 36.4,
// and 8 runs 31.2); 4 runs 0.924-0.939x, 3 runs 0.953x, 1 run 0.981x; 2 runs 6 rows ahead 0.948x,
// 8 rows 0.928x; 8 runs 4 rows ahead 1.072x (their lines in flight fill the L1); a far prefetch
// into L2 as well (16 rows) 0.920-0.939x, 32 rows 1.033x. llama-160m's step 0.986x (4 runs 0.979x).
// Over 4 KB pages the same reading took 1.020x (4 runs 0.999x): there the runtime keeps MR runs.
// bfloat16 fast math's pairs (`fp32_gemm: bf16`) read the same way: Qwen2-0.5B's decode step in
// the model, 8 interleaved rounds, 37.0 -> 33.3 ms (0.895x).
static std::atomic<bool> near_gemv{false};
constexpr int NEAR_RUNS = 2, NEAR_ROWS = 4;

// Panels [p0, p1) of a one-row product (float32, or bfloat16 in pairs), read in runs (panel_runs).
template <typename T>
static inline void gemv(int64_t N, int64_t K, const T* a, const T* bp, int64_t rows, void* c, int64_t ldc,
                        const Epilogue* e, int64_t p0, int64_t p1, bool stream = false) {
  auto run = [&](auto count, auto near, const int64_t* at) {
    constexpr int S = decltype(count)::value;
    const T* panels[S];
    for (int s = 0; s < S; ++s) panels[s] = bp + at[s] * rows * NR;
    V acc[S][NV];
    gemv_panels<S, decltype(near)::value>(K, a, panels, acc);
    for (int s = 0; s < S; ++s) store_row(acc[s], N, at[s], c, ldc, e, stream);
  };
  auto plain = [&](auto count, const int64_t* at) { run(count, std::integral_constant<int, 0>{}, at); };
  if (huge_page_packs.load(std::memory_order_relaxed)) {
    panel_runs<2>(p0, p1, plain);
  } else if (near_gemv.load(std::memory_order_relaxed)) {
    panel_runs<NEAR_RUNS>(p0, p1, [&](auto count, const int64_t* at) {
      run(count, std::integral_constant<int, NEAR_ROWS>{}, at);
    });
  } else {
    panel_runs(p0, p1, plain);
  }
}

// This thread's buffer of at least `elements` E for `Use` (a tag type: uses alive at once have
// their own), 64-byte aligned, grown as asked, valid until the thread's next request for `Use` (and
// E). Unlike Scratch, no in-use guard: a use's requests never nest.
template <typename Use, typename E> static E* thread_buffer(int64_t elements) {
  static thread_local std::unique_ptr<E, decltype(&std::free)> buffer{nullptr, &std::free};
  static thread_local int64_t held = 0;
  if (held < elements) {
    buffer.reset(static_cast<E*>(std::aligned_alloc(64, (elements * int64_t(sizeof(E)) + 63) / 64 * 64)));
    if (buffer == nullptr) {
      held = 0;
      throw std::bad_alloc();
    }
    held = elements;
  }
  return buffer.get();
}

// Where a source that makes its blocks (Src::dequantizes: kiln_gemm_quant.h's QuantPanels,
// WidenedPanels) writes them: valid until the thread's next block.
struct BlockBuffer;
static inline float* thread_block_buffer(int64_t floats) { return thread_buffer<BlockBuffer, float>(floats); }

// Where gemm finds a panel's K block of B: panels of T packed by pack_b, read where they lie. (A
// weight-only quantized B dequantizes each block into a thread's buffer instead:
// kiln_gemm_quant.h.) `raw` and `raw_bytes` are the block's memory as the prefetch of the next
// block asks for it.
template <typename T> struct Panels {
  static constexpr bool dequantizes = false;
  const T* bp;
  int64_t rows;  // a panel's rows: K (rounded up to even where bfloat16 pairs)
  const T* block(int64_t p, int64_t k0, int64_t) const { return bp + p * rows * NR + k0 * NR; }
  const char* raw(int64_t p, int64_t k0) const { return reinterpret_cast<const char*>(block(p, k0, 0)); }
  int64_t raw_bytes(int64_t kn) const { return kn * NR * int64_t(sizeof(T)); }
  int64_t bytes(int64_t panels) const { return panels * rows * NR * int64_t(sizeof(T)); }
};

// C [M, N] (row stride ldc) = epilogue(A [M, K] (row stride lda) @ B), B packed by pack_b.
// K is cut in equal blocks of at most kc (0: not cut; partial sums live in C, so only a float32 C
// is cut). For each K block, each thread runs its panels one by one, and over each panel's block
// every tile of its rows: A's block stays in L2 for all the thread's panels, and the panel's block
// in L1/L2 while A's rows stream past it (K blocks outermost: at 128x3072x768 with cold weights
// 279 -> 289 GFLOP/s on 2 threads, 149 -> 157 on one, against panels outermost).
// `src` gives the panels' blocks (Panels; a quantized source's are floats made block by block).
template <typename T, typename Src>
static void gemm_from(int64_t M, int64_t N, int64_t K, const T* a, int64_t lda, const Src& src, void* c, int64_t ldc,
                      const Epilogue* e, int64_t kc) {
  if (kc <= 0 || kc >= K || (e && e->out_bf16)) kc = K;
  kc = (K + (K + kc - 1) / kc - 1) / ((K + kc - 1) / kc);  // blocks of equal size, none larger than asked
  if (in_pairs<T>) kc = round_even(kc);  // blocks start at a pair
  const int64_t panels = (N + NR - 1) / NR, row_blocks = (M + MR - 1) / MR;
  // A GEMM of less work than this runs on the calling thread: waking the team costs ~1-2 us, more
  // than such a GEMM takes (a batch-1 projection of a small model; an MLP's 1x8x4 takes ~50 ns).
  const bool worth_threads = panels * row_blocks > 1 && 2 * M * N * K >= (int64_t(1) << 18);
  const bool resident = !Src::dequantizes && src.bytes(panels) <= (int64_t(256) << 10) && row_blocks >= 64;
  // A float32 C of 8 MB and more (Llama's logits, 128 x 32000) written in one K block with
  // streaming stores where its rows are whole vectors apart on aligned memory: much larger than
  // L2, its lines otherwise came from DRAM to be overwritten, then went back (128x512x32000, one
  // thread: 28.9 -> 25.8 ms). Not where C is read again (K blocks, the layer norm's rows, the
  // epilogue's pass over each tile).
  const bool stream = kc == K && !(e && (e->out_bf16 || e->row_norm || e->bias || e->unary || e->residual)) &&
                      M * N * 4 >= (int64_t(8) << 20) &&
                      ldc % L == 0 && reinterpret_cast<uintptr_t>(c) % KILN_VEC_BYTES == 0;
#pragma omp parallel if (worth_threads) num_threads(kiln::team())
  {
    const auto [p0, p1, r0, r1] = thread_share(N, panels, row_blocks);
    // Rows per pass over the thread's panels: A's block (rows x kc) stays in L2, about 1 MB, while
    // the panels stream past (at M = 128 one pass holds every row; at M = 2048 A would otherwise
    // come from L3 once per panel).
    const int64_t pass = std::max<int64_t>(1, (int64_t(1) << 20) / (MR * kc * int64_t(sizeof(T))));
    if constexpr ((std::is_same_v<T, float> || in_pairs<T>) && std::is_same_v<Src, Panels<T>>) {
      if (M == 1) {
        const bool row_stream = stream_row_output(1, N, c, ldc, e);
        gemv(N, K, a, src.bp, src.rows, c, ldc, e, p0, p1, row_stream);
        if (row_stream) kiln::store_stream_fence();
        goto rows_done;
      }
    }
    if (kc == K && resident) {
      // A weight small enough to stay in L2 (MobileViT's 1x1 convolutions: K 16-64, N 64-256,
      // M up to 16384): row blocks outermost, so a tile's rows of A stay in L1 for every panel
      // and C's rows are written whole, one after another (64x256 at M = 4096: 1.23 -> 1.08 ms
      // on one thread against panels outermost; oneDNN 0.91).
      for (int64_t rb = r0; rb < r1; ++rb) {
        const int64_t i0 = rb * MR;
        for (int64_t p = p0; p < p1; ++p) {
          const int cols = int(std::min<int64_t>(NR, N - p * NR));
          tile_rows(int(std::min<int64_t>(MR, M - i0)), cols, K, true, true, a + i0 * lda, lda,
                    src.block(p, 0, K), c, ldc, i0, p * NR, e, Ahead{nullptr, 0});
        }
      }
    } else
    for (int64_t b0 = r0; b0 < r1; b0 += pass) {
      const int64_t b1 = std::min(r1, b0 + pass);
      for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t kn = std::min<int64_t>(kc, K - k0);
        for (int64_t p = p0; p < p1; ++p) {
          const int cols = int(std::min<int64_t>(NR, N - p * NR));
          const bool more = p + 1 < p1 || k0 + kn < K;
          const char* next = p + 1 < p1 ? src.raw(p + 1, k0) : src.raw(p0, k0 + kn);
          const int64_t next_bytes = src.raw_bytes(p + 1 < p1 ? kn : std::min<int64_t>(kc, std::max<int64_t>(0, K - (k0 + kn))));
          const T* block = src.block(p, k0, kn);
          // The next block's lines spread evenly over this panel's tiles: the sparsest spacing
          // (2^shift steps apart) that still covers it. Asked for all at once, in the first
          // tiles, they came from DRAM slower than the tiles ran (at 128x768x3072 with cold
          // weights 311 -> 340 GFLOP/s on 2 threads of an Intel Xeon, MKL 318).
          const int64_t steps = in_pairs<T> ? (kn + 1) / 2 : kn, lines = (next_bytes + 63) / 64;
          const int shift = ahead_shift(b1 - b0, steps, lines);
          const int64_t per_tile = ahead_lines(steps, shift) * 64;
          for (int64_t rb = b0; rb < b1; ++rb) {
            const int64_t i0 = rb * MR, fetched = (rb - b0) * per_tile;
            const Ahead ahead{more && fetched < next_bytes ? next + fetched : nullptr, shift};
            tile_rows(int(std::min<int64_t>(MR, M - i0)), cols, kn, k0 == 0, k0 + kn == K, a + i0 * lda + k0, lda,
                      block, c, ldc, i0, p * NR, e, ahead, stream);
          }
        }
      }
    }
    if (stream) kiln::store_stream_fence();
  rows_done:
    if (e && e->row_norm) {  // every row whole once all threads have stored their panels
#pragma omp barrier
      norm_rows(static_cast<float*>(c), ldc, M, N, *e, omp_get_thread_num(), omp_get_num_threads());
    }
  }
}

// A [M, K] bfloat16 (row stride lda) as a float32 copy [M, K] (exact).
static std::unique_ptr<float[]> widened_rows(int64_t M, int64_t K, const kiln_bf16* a, int64_t lda) {
  std::unique_ptr<float[]> wide(new float[M * K]);
  const int64_t whole = K / L * L;
#pragma omp parallel for if (M * K >= (int64_t(1) << 16)) num_threads(kiln::team())
  for (int64_t i = 0; i < M; ++i) {
    int64_t k = 0;
    for (; k < whole; k += L) kiln::store(wide.get() + i * K + k, kiln::load_bf16(a + i * lda + k));
    for (; k < K; ++k) wide[i * K + k] = float(a[i * lda + k]);
  }
  return wide;
}

#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
// bfloat16 pair panels ([K/2][NR][2]) as float32 blocks [kn][NR], widened in this thread's buffer
// (valid until its next block): a word's high half in place is its odd k's value, shifted up 16
// its even k's. Exact; once per block per pass over a thread's rows.
struct WidenedPanels {
  static constexpr bool dequantizes = true;
  const kiln_bf16* bp;
  int64_t rows;  // a panel's rows (K rounded up to even)

  const char* raw(int64_t p, int64_t k0) const { return reinterpret_cast<const char*>(bp + (p * rows + k0 / 2 * 2) * NR); }
  int64_t raw_bytes(int64_t kn) const { return (kn + 1) * NR * int64_t(sizeof(kiln_bf16)); }
  int64_t bytes(int64_t panels) const { return panels * rows * NR * int64_t(sizeof(kiln_bf16)); }

  const float* block(int64_t p, int64_t k0, int64_t kn) const {
    float* buffer = thread_block_buffer(kn * NR);
    using IV = kiln::vec<int32_t>;
    const kiln_bf16* panel = bp + p * rows * NR;
    for (int64_t k = k0; k < k0 + kn; ++k) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        IV words;
        std::memcpy(&words, panel + ((k / 2) * NR + v * L) * 2, sizeof(words));
        kiln::store(buffer + (k - k0) * NR + v * L, (V)(k % 2 ? words & int32_t(0xFFFF0000u) : words << 16));
      }
    }
    return buffer;
  }
};

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && KILN_VEC_BYTES == 64
// BF16_AMX: the product on AMX's tiles (kiln_gemm_amx.h, the translation unit's next header).
#define KILN_GEMM_AMX 1
static bool amx_usable();
static void gemm_bf16_amx(int64_t M, int64_t N, int64_t K, const kiln_bf16* a, int64_t lda, const kiln_bf16* bp,
                          void* c, int64_t ldc, const Epilogue* e);
#endif

// C = epilogue(A @ B), bfloat16 A (row stride lda) and pair panels, by `product`: vdpbf16ps in the
// tiles, or A widened to a float32 copy and the panels block by block (WidenedPanels) through
// float32's tile. The same products of the same values: sums in another order, within float32's
// accumulation bound either way.
static void gemm_bf16_by(int product, int64_t M, int64_t N, int64_t K, const kiln_bf16* a, int64_t lda,
                         const kiln_bf16* bp, void* c, int64_t ldc, const Epilogue* e, int64_t kc) {
#ifdef KILN_GEMM_AMX
  if (product == BF16_AMX && amx_usable()) return gemm_bf16_amx(M, N, K, a, lda, bp, c, ldc, e);
#endif
  // (A's float32 copy up to 64 MB: beyond, a long prompt's bfloat16 product keeps vdpbf16ps)
  if (product != BF16_FMA || M * K > (int64_t(1) << 24))
    return gemm_from(M, N, K, a, lda, Panels<kiln_bf16>{bp, round_even(K)}, c, ldc, e, kc);
  const std::unique_ptr<float[]> wide = widened_rows(M, K, a, lda);
  gemm_from(M, N, K, wide.get(), K, WidenedPanels{bp, round_even(K)}, c, ldc, e, kc);
}

// The faster way to multiply a bfloat16 product of BF16_WIDEN_ROWS rows or more on this CPU
// (Bf16Product), measured once per process at the first: a 64x512x768 product from L2, best of 5
// each. vdpbf16ps makes two products a lane where an FMA makes one, but on 2 threads of the Intel
// Xeon (family 6 model 207) it ran at a quarter of the FMAs' rate per product: 169-174 GFLOP/s at
// 128x768x3072 against float32's 336-347.
static int bf16_fastest_product() {
  static const int fastest = [] {
    const int64_t M = 64, K = 512, N = 768;
    std::unique_ptr<kiln_bf16[]> a(new kiln_bf16[M * K]), b(new kiln_bf16[K * N]), bp(new kiln_bf16[packed_elements<kiln_bf16>(K, N)]);
    for (int64_t i = 0; i < M * K; ++i) a[i] = kiln_bf16(float(i % 13) * 0.25f - 1.5f);
    for (int64_t i = 0; i < K * N; ++i) b[i] = kiln_bf16(float(i % 7) * 0.125f - 0.375f);
    pack_b(b.get(), K, N, N, 1, bp.get());
    std::unique_ptr<float[]> c(new float[M * N]);
    double best[3] = {1e9, 1e9, 1e9};
    int products = 2;
#ifdef KILN_GEMM_AMX
    if (amx_usable()) products = 3;
#endif
    for (int round = 0; round < 6; ++round)
      for (int product = 0; product < products; ++product) {
        const auto start = std::chrono::steady_clock::now();
        gemm_bf16_by(product, M, N, K, a.get(), K, bp.get(), c.get(), N, nullptr, 0);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (round > 0) best[product] = std::min(best[product], seconds);  // (round 0 warms the caches)
      }
    return int(std::min_element(best, best + products) - best);
  }();
  return fastest;
}
#else
static int bf16_fastest_product() { return -1; }  // (no pairs: bfloat16 is widened on load, one way)
#endif

// The product bfloat16 pairs take (Bf16Product): the one a test forced, else the fastest measured.
static int bf16_product() {
  const int forced = bf16_product_forced.load(std::memory_order_relaxed);
  return forced >= 0 ? forced : bf16_fastest_product();
}

template <typename T>
static void gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t lda, const T* bp, void* c, int64_t ldc,
                 const Epilogue* e, int64_t kc) {
#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
  if constexpr (std::is_same_v<T, kiln_bf16>) {
    // AMX where it is the fastest from 2 rows on: a few rows' product streams its weight faster
    // through the tiles than through vdpbf16ps (2 threads of the Intel Xeon with AMX, 896x4864
    // from L3: 2 rows 404 -> 295 us, 4 rows 419 -> 257, 16 rows 982 -> 305).
    if (M >= 2) {
      const int product = bf16_product();
      if (M >= BF16_WIDEN_ROWS || product == BF16_AMX) return gemm_bf16_by(product, M, N, K, a, lda, bp, c, ldc, e, kc);
    }
  }
#endif
  gemm_from(M, N, K, a, lda, Panels<T>{bp, in_pairs<T> ? round_even(K) : K}, c, ldc, e, kc);
}

}  // namespace kiln_gemm
