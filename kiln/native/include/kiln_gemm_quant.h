// kiln's GEMM over a weight-only quantized B: C = epilogue(A @ dequantize(B)), A float32.
//
// What a decode step at batch 1 waits for is the weights' bytes coming from memory; stored as int8
// (per output column, a float scale: w = q * scale) or int4 (per group of `group` rows of k and
// column, a float scale and zero point: w = (q - zero) * scale, q in 0..15), a weight reads a
// quarter or an eighth of float32's bytes. The packed form keeps kiln_gemm.h's panels of NR
// columns, each column's k in 32-bit lanes: int8 quads [panels][ceil(K / 4)][NR], k's byte at
// bits 8 (k % 4) of quad k / 4 (zero past K: the four k a dot product instruction takes in one
// lane); int4 words [panels][ceil(K / 8)][NR], k's nibble at bits 4 (k % 8) of word k / 8 (a
// column's 4 stored bytes 4 (k / 8) .. + 3, read as one word).
// After the panels, 64-byte aligned, the table [panels][groups][NR] of 32-bit words: int8's the
// columns' float scales; int4's a float 16 scale whose low 4 bits hold the zero point (0..15), so
// that a group's scales and zeros come as one stream of lines, not two (QuantPanels::scale, zero). A
// padded column's word is 0. int4's weights are unpacked as q / 16 (nibble_lanes), and (q / 16 -
// zero / 16) * 16 scale is (q - zero) * scale to the bit: 16 scale and zero / 16 are exact, and
// kiln.quantize rounds each scale to 19 bits of mantissa (kiln/quant/weights.py), so that its
// low 4 bits are free; a scale that is not so rounded is rounded here (2^-20 of itself at most).
//
// gemm_from (kiln_gemm.h) runs as for float32 panels, every epilogue included; only where a tile
// would read a panel's K block, QuantPanels dequantizes that block into the thread's buffer of
// float32 [kn][NR] (in L1/L2: at most K_BLOCK x NR floats), which the tiles of all the thread's
// rows then read. The weight's bytes come from memory once per block; the dequantization costs a
// few instructions per vector of weights, amortized over the rows (decode: 1 to 4), well under
// what a float32 weight's extra bytes cost.
#pragma once
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <cstdlib>
#include <memory>

namespace kiln_gemm {

struct QuantShape {
  int bits;            // 8 or 4
  int64_t K, N, group; // group: rows of k sharing a scale (int8: K, one per column)
  int64_t panels() const { return (N + NR - 1) / NR; }
  int64_t groups() const { return (K + group - 1) / group; }
  int64_t words() const { return (K + 7) / 8; }                        // int4: 32-bit words per column
  int64_t quads() const { return (K + 3) / 4; }                        // int8: 32-bit quads per column
  int64_t rows() const { return 4 * (bits == 8 ? quads() : words()); } // bytes per column of a panel
  static int64_t aligned(int64_t bytes) { return (bytes + 63) / 64 * 64; }
  int64_t q_bytes() const { return aligned(panels() * rows() * NR); }
  int64_t table_bytes() const { return aligned(panels() * groups() * NR * int64_t(sizeof(float))); }
  int64_t bytes() const { return q_bytes() + table_bytes(); }
};

// int4's table word of a group and column: 16 scale rounded to its top 28 bits (to nearest), the
// zero point (a whole number in 0..15) in the low 4.
static inline uint32_t int4_table_word(float scale, float zero) {
  uint32_t bits;
  const float scaled = 16.0f * scale;
  std::memcpy(&bits, &scaled, sizeof bits);
  return ((bits + 8u) & ~15u) | (uint32_t(zero) & 15u);
}

// Pack q (int8: [N, K] int8; int4: [N, ceil(K / 2)] bytes, even k in the low nibble, rows
// contiguous), scales [N, groups] and (int4) zeros [N, groups], whole numbers in 0..15, into
// `out` (shape.bytes()).
static void pack_quant(const QuantShape& z, const uint8_t* q, const float* scales, const float* zeros, uint8_t* out) {
  const int64_t panels = z.panels(), rows = z.rows(), groups = z.groups();
  float* scale_out = reinterpret_cast<float*>(out + z.q_bytes());
  uint32_t* word_out = reinterpret_cast<uint32_t*>(scale_out);
#pragma omp parallel for num_threads(kiln::team())
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t j0 = p * NR, n = std::min<int64_t>(NR, z.N - j0);
    uint8_t* dst = out + p * rows * NR;
    if (z.bits == 8) {  // quad u of column j: k 4u .. 4u + 3 (zero past K)
      for (int64_t k = 0; k < rows; ++k)
        for (int64_t j = 0; j < NR; ++j) dst[(k / 4 * NR + j) * 4 + k % 4] = j < n && k < z.K ? q[(j0 + j) * z.K + k] : 0;
    } else {  // word w of column j: its bytes 4w .. 4w + 3 (zero past ceil(K / 2))
      const int64_t stored = (z.K + 1) / 2;
      for (int64_t w = 0; w < z.words(); ++w)
        for (int64_t j = 0; j < NR; ++j)
          for (int64_t b = 0; b < 4; ++b)
            dst[(w * NR + j) * 4 + b] = j < n && 4 * w + b < stored ? q[(j0 + j) * stored + 4 * w + b] : 0;
    }
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t j = 0; j < NR; ++j) {
        const float scale = j < n ? scales[(j0 + j) * groups + g] : 0.0f;
        if (z.bits == 8) scale_out[(p * groups + g) * NR + j] = scale;
        else word_out[(p * groups + g) * NR + j] = j < n ? int4_table_word(scale, zeros[(j0 + j) * groups + g]) : 0u;
      }
  }
}

// int4's nibble `field` (0..7) of each lane's word, as the float32 q / 16, without converting an
// integer (a widening and an FP-pipe conversion per vector): the nibble masked where it lies,
// bits p..p+3, under the exponent that makes its lowest bit worth 1/16 (2^(19 - p): a float
// 2^(19 - p) + q / 16, exactly), then
// that power of two subtracted (exact). One bitwise op (vpternlogd's (x & m) | c) and one
// subtraction per vector of weights; fields 5..7 (bits 20..31, where the exponent lies) are moved
// down 12 bits first, one shift for the three. (Adding the power of two back with the zero
// point instead of subtracting it per weight would sum values up to 2^19 where q / 16 is at most
// 15/16: float32's rounding of those sums would swamp the products. Shifting every nibble to one
// place under 1.0's exponent, 1 + q / 16, and taking the 1 out with the zero point also works, but
// its sums' rounding grows with 16 + q where it grows with |q - zero|: 8e-6 of error where the
// float32 weights' product has 7e-6 at K = 64. Neither ran faster: at a decode step's row the int8
// and int4 GEMVs both run at ~26 G weights/s a core from L2 on Zen 4, where every AVX-512 op takes
// two of four pipes' slots and a weight vector costs three: int8 is bound by memory at 2 cores,
// int4 by these instructions.)
static inline V nibble_lanes(kiln::vec<int32_t> words, int field) {
  const int at = field < 5 ? 4 * field : 4 * field - 12;
  const kiln::vec<int32_t> source = field < 5 ? words : (kiln::vec<int32_t>)((kiln::vec<uint32_t>)words >> 12);
  const kiln::vec<int32_t> bits = (source & (15 << at)) | ((127 + 19 - at) << 23);
  V w;
  std::memcpy(&w, &bits, sizeof(V));
  return w - float(1 << (19 - at));
}

static inline kiln::vec<int32_t> load_words(const uint8_t* p) {
  kiln::vec<int32_t> words;
  std::memcpy(&words, p, sizeof(words));
  return words;
}

// int8's byte `field` (0..3) of each lane's quad, sign-extended: shifted to the top, then down.
static inline V byte_lanes(kiln::vec<int32_t> quads, int field) {
  return __builtin_convertvector((quads << (24 - 8 * field)) >> 24, V);
}

// L weights of row k of a panel's column vector v, as float32 lanes: int8 as byte_lanes, int4 as
// nibble_lanes (q / 16).
template <int BITS> static inline V quant_lanes(const uint8_t* panel, int64_t k, int v) {
  if constexpr (BITS == 8) {
    return byte_lanes(load_words(panel + ((k >> 2) * NR + v * L) * 4), int(k & 3));
  } else {
    return nibble_lanes(load_words(panel + ((k >> 3) * NR + v * L) * 4), int(k & 7));
  }
}

template <int BITS> struct QuantPanels {
  static constexpr bool dequantizes = true;
  QuantShape z;
  const uint8_t* packed;

  const uint8_t* panel(int64_t p) const { return packed + p * z.rows() * NR; }
  const uint8_t* table(int64_t p, int64_t g) const { return packed + z.q_bytes() + (p * z.groups() + g) * NR * 4; }
  // Group g's scales of the vector v of panel p's columns: int8's scale, int4's 16 scale.
  V scale(int64_t p, int64_t g, int v) const {
    const kiln::vec<int32_t> word = load_words(table(p, g) + v * L * 4);
    return BITS == 4 ? (V)(word & ~15) : (V)word;
  }
  // int4: group g's zero points of those columns, over 16 (exact).
  V zero(int64_t p, int64_t g, int v) const {
    return __builtin_convertvector(load_words(table(p, g) + v * L * 4) & 15, V) * (1.0f / 16.0f);
  }
  const char* raw(int64_t p, int64_t k0) const {
    return reinterpret_cast<const char*>(panel(p) + (BITS == 8 ? k0 / 4 : k0 / 8) * 4 * NR);
  }
  int64_t raw_bytes(int64_t kn) const { return (BITS == 8 ? (kn + 3) / 4 : (kn + 7) / 8) * 4 * NR; }
  int64_t bytes(int64_t) const { return z.bytes(); }

  // Rows [k0, k0 + kn) of panel p as float32 [kn][NR], in this thread's buffer (valid until its
  // next block).
  const float* block(int64_t p, int64_t k0, int64_t kn) const {
    float* buffer = thread_block_buffer(kn * NR);
    const uint8_t* q = panel(p);
    for (int64_t k = k0; k < k0 + kn;) {
      const int64_t g = k / z.group, end = std::min(k0 + kn, (g + 1) * z.group);
      V scale[NV], zero[NV];
      for (int v = 0; v < NV; ++v) {
        scale[v] = this->scale(p, g, v);
        zero[v] = BITS == 4 ? this->zero(p, g, v) : V{};
      }
      for (; k < end; ++k) {
        float* row = buffer + (k - k0) * NR;
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          const V w = quant_lanes<BITS>(q, k, v);
          // As eager's reference computes it ((q - zero) * scale; int8: q * scale): the same bits
          // (int4: (q / 16 - zero / 16) * 16 scale, each step exact but the last).
          kiln::store(row + v * L, BITS == 4 ? (w - zero[v]) * scale[v] : w * scale[v]);
        }
      }
    }
    return buffer;
  }
};

// A GEMM of at most this many rows (a decode step's batch) dequantizes in registers instead: the
// buffer's store and reload per weight cost more than the product at one row (the int8 GEMV ran at
// a third of the memory's speed through it).
constexpr int DIRECT_ROWS = 4;

// How far ahead an int4 panel's words are prefetched (a word row is NR lanes of 4 bytes: 32 are
// 8 KB at NR = 64). 8 words ahead left the int4 GEMV short of the memory's speed where a thread
// streams few panels (2 cores, cold weights: 1x3072x768 0.062 -> 0.055 ms, 1x768x768 0.023 ->
// 0.017 at 24-48 words ahead, int8 unchanged at its own distance). The KILN_* macros time others.
#ifdef KILN_INT4_PREFETCH_WORDS
constexpr int64_t INT4_PREFETCH_WORDS = KILN_INT4_PREFETCH_WORDS;
#else
constexpr int64_t INT4_PREFETCH_WORDS = 32;
#endif

// Where the one-row products' far prefetches put the weight's lines (__builtin_prefetch's
// locality: 3 prefetcht0, into L1; 2 prefetcht1, into L2). Into L1 their lines in flight (int8's
// eight runs 3 KB ahead each, the digits' runs 8 KB) are most of the 32 KB L1 and evict one another
// and the activations; into L2 the L1's own prefetcher brings each the last steps. A llama-160m
// decode step's quantized products (12 layers and the LM head, weights cycled from DRAM, 2 threads
// of a 2-core AMD EPYC Zen 4, median of 15 interleaved rounds, through benchmarks/kernels.py): one
// row int8 4.31 -> 3.73 ms, int4 (digits) 2.43 -> 2.35, int8 activations 2.47 -> 2.20; at four
// rows (direct_tile's short prefetch, kept in L1) int8 lost 11 % with it.
#ifdef KILN_QUANT_LOCALITY
constexpr int FAR_LOCALITY = KILN_QUANT_LOCALITY;
#else
constexpr int FAR_LOCALITY = 2;
#endif

// C rows [0, rows) of panel p's columns, every k at once. Per group the sums are of raw levels,
// part = sum_k a_k q_k, scaled once at the group's end: acc += (part - zero * asum) * scale =
// sum_k a_k (q_k - zero) scale, with asum = sum_k a_k over the group (`asums`, the same for every
// panel: summed once per call; int4's levels are q / 16, its zero zero / 16 and its scale 16
// scale, the same algebra). Per vector of weights a step is a widening and a conversion (int8) or
// a bitwise op and a subtraction (int4, eight k from one load) and one FMA per row: the scale's product and the zero's
// subtraction per weight cost as much again (the int4 GEMV was bound by them, not by memory). k
// goes round two sets of sums where the rows are few, so that each FMA does not wait on the last
// (a row's three vectors of sums alone are three chains of 4-cycle FMAs: the GEMV was latency-bound).
template <int BITS, int R>
static inline void direct_tile(const QuantPanels<BITS>& src, int64_t p, int rows, int cols, const float* a,
                               int64_t lda, const float* asums, void* c, int64_t ldc, const Epilogue* e) {
  constexpr int SETS = R <= 2 ? 2 : 1;
  V acc[R][NV];
  clear(acc);
  const uint8_t* q = src.panel(p);
  const int64_t K = src.z.K, groups = src.z.groups();
  for (int64_t k = 0; k < K;) {
    const int64_t g = k / src.z.group, end = std::min(K, (g + 1) * src.z.group);
    V part[SETS][R][NV];
#pragma GCC unroll 2
    for (int s = 0; s < SETS; ++s) clear(part[s]);
    auto add = [&](int set, int64_t kk, const V (&w)[NV]) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const V ar = broadcast(a + r * lda + kk);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) part[set][r][v] = fma(ar, w[v], part[set][r][v]);
      }
    };
    // Whole 32-bit lanes inside the group (int8 a quad, 4 k; int4 a word, 8 k), each loaded once for
    // its k; a group edge inside a lane (int4 groups not a multiple of 8) or K's end takes the
    // lane's k one at a time, here and below.
    constexpr int64_t PER_LANE = BITS == 8 ? 4 : 8, AHEAD = BITS == 8 ? 16 : 8 * INT4_PREFETCH_WORDS;
    for (; k % PER_LANE && k < end; ++k) {
      V w[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) w[v] = quant_lanes<BITS>(q, k, v);
      add(0, k, w);
    }
    for (; k + PER_LANE <= end; k += PER_LANE) {
      kiln::vec<int32_t> lanes[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        __builtin_prefetch(src.raw(p, k + AHEAD) + v * L * 4);  // each vector's line ahead (the weight streams from memory)
        lanes[v] = load_words(q + (k / PER_LANE * NR + v * L) * 4);
      }
#pragma GCC unroll 8
      for (int field = 0; field < PER_LANE; ++field) {
        V w[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) w[v] = BITS == 8 ? byte_lanes(lanes[v], field) : nibble_lanes(lanes[v], field);
        add(field % SETS, k + field, w);
      }
    }
    for (; k < end; ++k) {  // int8: K's last, partial quad; int4: the nibbles of a group's last, partial word
      V w[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) w[v] = quant_lanes<BITS>(q, k, v);
      add(0, k, w);
    }
    V scale[NV], zero[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      scale[v] = src.scale(p, g, v);
      zero[v] = BITS == 4 ? src.zero(p, g, v) : V{};
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const V asum = BITS == 4 ? broadcast(asums + r * groups + g) : V{};
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        V sum = SETS == 2 ? part[0][r][v] + part[SETS - 1][r][v] : part[0][r][v];
        if constexpr (BITS == 4) sum -= asum * zero[v];
        acc[r][v] = fma(sum, scale[v], acc[r][v]);
      }
    }
  }
  store_block<R>(acc, rows, cols, 0, p * NR, c, ldc, e, true);
}

#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
// int4 at a few rows on CPUs with bfloat16 dot products (vdpbf16ps: two products a lane, 32 a
// vector instruction). The float32 path above costs three vector instructions per 16 weights
// (unpack, subtract, FMA): on Zen 4 (every AVX-512 op two of four pipes' slots) it ran at 26 G
// weights/s a core, both cores' int4 GEMV below the memory's speed (26 GB/s of 33), no faster
// than int8's. This one costs two per 16 (a shift and a vpternlogd make 32 weights, two
// vdpbf16ps take them): 39 G weights/s a core, the memory's speed at 2 cores.
//
// What it computes: a weight is 1 + q / 16 in bfloat16 (five significant bits: exact), its
// product with a bfloat16 exact in float32. Each activation is carried as the sum of two
// bfloat16, hi = bf16(a) and lo = bf16(a - hi): 16 significant bits, |a - (hi + lo)| <= 2^-16 |a|,
// so the result is the float32-accumulated product of those activations with the dequantized
// weights, within 2^-16 sum_k |a_k w_k| of the exact one (an int4 weight is within half a step,
// 2^-5 of its group's range, of the float weight it stands for: the quantization's error is
// thousands of times this one). A third bfloat16 would carry a exactly and cost a third more
// instructions: measured as slow as the float32 path. The 1 in each weight is taken out per word
// (8 k: sum_k x_k (1 + q_k / 16) - sum_k x_k, x = hi + lo, summed beforehand) so that the
// sums stay those of x q / 16 and round as float32's do; the zero point with each group's sum of
// x, as the float32 path does. tests/quant/test_quantized_gemm.py checks against float64 of the
// same split.
//
// Activations per row as pairs of k for each word w (k = 8w + j and 8w + j + 4, j = 0..3: the
// nibbles 16 bits apart in the word, so one shift puts both under bfloat16's mantissa top):
// hi pairs then lo pairs, [rows][words][4] 32-bit (two bfloat16) each; k past K are 0.
struct SplitActivations {
  int64_t words;
  Scratch<SplitActivations> memory;
  uint32_t* pairs;  // [rows][2][words][4]: hi, then lo
  float* word_sums;  // [rows][words]: each word's 8 values of hi + lo summed
  SplitActivations(int64_t M, int64_t words_)
      : words(words_), memory(M * words_ * (8 * int64_t(sizeof(uint32_t)) + int64_t(sizeof(float)))),
        pairs(memory.at<uint32_t>(0)), word_sums(memory.at<float>(M * words_ * 8 * int64_t(sizeof(uint32_t)))) {}
  const uint32_t* part(int r, int which) const { return pairs + (int64_t(r) * 2 + which) * words * 4; }
  const float* sums(int r) const { return word_sums + int64_t(r) * words; }
};

// The split of rows [0, M) of a, and each row's sum of hi + lo per group (asums [M][groups]) and
// per word: 16 k (two words) a step, vcvtneps2bf16 rounding as kiln_bf16 does (to nearest even;
// the instruction takes float32 denormals as zero: activations below 2^-126 carry as 0), one
// vpermw putting each word's k and k + 4 side by side. (A scalar loop with a division per k for
// its group cost ~10 ns a k: 2 ms of TinyLlama's 22 ms int4 decode step.)
static SplitActivations split_activations(const QuantShape& z, int64_t M, const float* a, int64_t lda, float* asums) {
  SplitActivations s(M, z.words());
  const int64_t groups = z.groups(), group_words = z.group / 8;
  // 16-bit lanes of one step's 16 bfloat16 (k 0..15) in pair order: (0, 4), (1, 5), ... (11, 15).
  const __m256i pair_order = _mm256_setr_epi16(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  auto widen = [](__m256bh h) {  // bfloat16 -> float32, exact
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
  };
  auto sum8 = [](__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
  };
  for (int64_t r = 0; r < M; ++r) {
    uint32_t* parts[2];
    for (int which = 0; which < 2; ++which) parts[which] = s.pairs + (r * 2 + which) * s.words * 4;
    float* word_sums = s.word_sums + r * s.words;
    for (int64_t w = 0; w < s.words; w += 2) {
      const int64_t k0 = 8 * w;
      const __mmask16 in = z.K - k0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (z.K - k0)) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(in, a + r * lda + k0);  // (k past K: 0)
      const __m256bh hi = _mm512_cvtneps_pbh(x);
      const __m512 hi_f = widen(hi);
      const __m256bh lo = _mm512_cvtneps_pbh(_mm512_sub_ps(x, hi_f));  // (x - hi: exact)
      const __m512 carried = _mm512_add_ps(hi_f, widen(lo));  // exact
      const __m256i pairs[2] = {_mm256_permutexvar_epi16(pair_order, (__m256i)hi),
                                _mm256_permutexvar_epi16(pair_order, (__m256i)lo)};
      const bool both = w + 1 < s.words;  // (an odd count of words: the last step has one)
      for (int which = 0; which < 2; ++which) {
        if (both) _mm256_storeu_si256(reinterpret_cast<__m256i*>(parts[which] + w * 4), pairs[which]);
        else _mm_storeu_si128(reinterpret_cast<__m128i*>(parts[which] + w * 4), _mm256_castsi256_si128(pairs[which]));
      }
      word_sums[w] = sum8(_mm512_castps512_ps256(carried));
      if (both) word_sums[w + 1] = sum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(carried), 1)));
    }
    for (int64_t g = 0; g < groups; ++g) {  // (a group is whole words: its size a multiple of 8)
      float total = 0.0f;
      for (int64_t w = g * group_words; w < std::min(s.words, (g + 1) * group_words); ++w) total += word_sums[w];
      asums[r * groups + g] = total;
    }
  }
  return s;
}

// As direct_tile<4, R> over bfloat16 pairs: group sizes a multiple of 8 (a word never straddles two).
template <int R>
static inline void direct_tile_bf16(const QuantPanels<4>& src, int64_t p, int rows, int cols,
                                    const SplitActivations& act, const float* asums, void* c, int64_t ldc,
                                    const Epilogue* e) {
  V acc[R][NV];
  clear(acc);
  const uint8_t* q = src.panel(p);
  const int64_t groups = src.z.groups(), words = src.z.words(), group_words = src.z.group / 8;
  const __m512i mantissa = _mm512_set1_epi32(0x00780078), one = _mm512_set1_epi32(0x3F803F80);
  constexpr int SETS = 2;  // the hi products' sums and the lo products' (two chains of sums a vector and row)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t w_end = std::min(words, (g + 1) * group_words);
    V part[SETS][R][NV];
#pragma GCC unroll 2
    for (int s = 0; s < SETS; ++s) clear(part[s]);
    for (int64_t w = g * group_words; w < w_end; ++w) {
      __m512i word[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        __builtin_prefetch(src.raw(p, (w + INT4_PREFETCH_WORDS) * 8) + v * L * 4);
        word[v] = _mm512_loadu_si512(q + (w * NR + v * L) * 4);
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m512bh b[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          // Nibbles j and j + 4 (bits 4j.., 4j + 16..) to bits 3..6 and 19..22, each half's mantissa top.
          const __m512i at = j == 0 ? _mm512_slli_epi32(word[v], 3) : _mm512_srli_epi32(word[v], 4 * j - 3);
          b[v] = (__m512bh)_mm512_ternarylogic_epi32(at, mantissa, one, 0xEA);  // (at & mantissa) | one
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
          for (int which = 0; which < 2; ++which) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32(int(act.part(r, which)[w * 4 + j]));
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) part[which][r][v] = (V)_mm512_dpbf16_ps((__m512)part[which][r][v], x, b[v]);
          }
      }
      // The word's 1s out now, while the sums are short: Σ x (1 + q / 16) - Σ x = Σ x q / 16.
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const V offsets = broadcast(act.sums(r) + w);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) part[0][r][v] -= offsets;
      }
    }
    V scale[NV], offset[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      scale[v] = src.scale(p, g, v);
      offset[v] = src.zero(p, g, v);  // zero / 16
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const V asum = broadcast(asums + r * groups + g);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        acc[r][v] = fma(part[0][r][v] + part[1][r][v] - asum * offset[v], scale[v], acc[r][v]);
      }
    }
  }
  store_block<R>(acc, rows, cols, 0, p * NR, c, ldc, e, true);
}
#endif

// int8 at one row, `S` panels at once (kiln_gemm.h panel_runs: a thread's panels in runs, more of
// the weight's lines in flight from DRAM), one scale per column (a single group): each panel's sum
// of a_k q_k, scaled at the end. A panel at a time it streamed 14.6-17 GB/s from DRAM where the same
// weight from L2 ran at 38-45 (2 threads of an Intel Xeon): bound by the one stream, not by its
// widening, conversion and FMA per vector of weights. Runs of 8 panels: 21.9-24.4 GB/s; with each
// run's rows asked for INT8_AHEAD rows ahead (3 KB at NR = 48: an int8 panel's row is under a
// line, and the hardware prefetcher stayed too close): 24.2-27.1.
#ifdef KILN_INT8_AHEAD
constexpr int64_t INT8_AHEAD = KILN_INT8_AHEAD;
#else
constexpr int64_t INT8_AHEAD = 64;
#endif
// `a` padded with zeros to whole quads.
template <int S>
static inline void int8_row(const QuantPanels<8>& src, const int64_t* at, const float* a, void* c, int64_t ldc,
                            const Epilogue* e) {
  const uint8_t* q[S];
  for (int s = 0; s < S; ++s) q[s] = src.panel(at[s]);
  V acc[S][NV];
  clear(acc);
  for (int64_t u = 0; u < src.z.quads(); ++u) {
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)  // the runs' rows INT8_AHEAD ahead, a quad (4 NR bytes) each step
      for (int64_t byte = 0; byte < 4 * NR; byte += 64) __builtin_prefetch(q[s] + (4 * u + INT8_AHEAD) * NR + byte, 0, FAR_LOCALITY);
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const kiln::vec<int32_t> quads = load_words(q[s] + (u * NR + v * L) * 4);
#pragma GCC unroll 4
        for (int field = 0; field < 4; ++field) acc[s][v] = fma(broadcast(a + 4 * u + field), byte_lanes(quads, field), acc[s][v]);
      }
  }
  for (int s = 0; s < S; ++s) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[s][v] *= src.scale(at[s], 0, v);
    store_row(acc[s], src.z.N, at[s], c, ldc, e);
  }
}

// int4 at one row on the float32 path, `S` panels at once (as int8_row), groups of whole words;
// `a` padded with zeros to whole words. Each activation is broadcast from memory into its FMAs;
// fields alternate between two sets of sums, as direct_tile's do (one set had three times its
// rounding error at groups of 128); the group's scaled sums go to memory. Four runs, not eight:
// their sums fill the register file. From DRAM a panel at a time it streamed 16-20 GB/s where the
// same weight from L2 ran at 24-27 (2 threads of an Intel Xeon).
constexpr int INT4_RUNS = 4;
template <int S>
static inline void int4_row(const QuantPanels<4>& src, const int64_t* at, const float* a, const float* asums, void* c,
                            int64_t ldc, const Epilogue* e) {
  const uint8_t* q[S];
  for (int s = 0; s < S; ++s) q[s] = src.panel(at[s]);
  const int64_t groups = src.z.groups(), words = src.z.words(), group_words = src.z.group / 8;
  V acc[S][NV];
  clear(acc);
  for (int64_t g = 0; g < groups; ++g) {
    V part[2][S][NV];
    clear(part[0]);
    clear(part[1]);
    for (int64_t w = g * group_words; w < std::min(words, (g + 1) * group_words); ++w) {
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        kiln::vec<int32_t> word[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          __builtin_prefetch(q[s] + ((w + INT4_PREFETCH_WORDS) * NR + v * L) * 4, 0, FAR_LOCALITY);
          word[v] = load_words(q[s] + (w * NR + v * L) * 4);
        }
#pragma GCC unroll 8
        for (int f = 0; f < 8; ++f)
#pragma GCC unroll 8
          for (int v = 0; v < NV; ++v)
            part[f % 2][s][v] = fma(broadcast(a + 8 * w + f), nibble_lanes(word[v], f), part[f % 2][s][v]);
      }
    }
    const V asum = broadcast(asums + g);
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[s][v] = fma(part[0][s][v] + part[1][s][v] - asum * src.zero(at[s], g, v), src.scale(at[s], g, v), acc[s][v]);
  }
  for (int s = 0; s < S; ++s) store_row(acc[s], src.z.N, at[s], c, ldc, e);
}

// A few rows' row norm (a direct product's rows are normalized here, each whole, after every panel's store).
// Whether the epilogue is a gated product's (Epilogue::gated_width).
static inline bool gated(const Epilogue* e) { return e && e->gated_width; }

static inline void normalize_rows(int64_t M, int64_t N, void* c, int64_t ldc, const Epilogue* e) {
  if (!e || !e->row_norm) return;
  if (e->row_norm == SOFTMAX || e->row_norm == LOG_SOFTMAX) softmax_rows(static_cast<float*>(c), ldc, N, 0, M, *e);
  else layer_norm_rows(static_cast<float*>(c), ldc, N, 0, M, *e);
}

// ---- int4 at a few rows with integer activations: vpdpbusd ----
//
// Two uses. (1) int8 activations (kiln.quantize(..., activations="int8")): each call quantizes the
// layer's rows per group of the weight's `group` k: scale = amax / 127 (1 where the group is all
// zero), q = round(x * (127 * (1 / amax))) in -127..127 (to nearest even), x' = q * scale, and the
// product is x' @ dequantize(B); kiln/quant/weights.py `quantize_activations` is the reference and
// takes each step as here, so the levels are the same. (2) Weight-only int4 or int8 with float32
// activations, each group of a row carried as int8 digits with power-of-two scales, each digit the
// rounded remainder of the last (exact: a float times a power of two, and a remainder smaller than
// the float's own place). Two at int4's weights (activation_digits): x ~ q1 2^e + q2 2^(e - 8), 2^e
// the least power of two with the group's largest |x| at most 127 steps (so above 63.5 steps):
// |q1| <= 127, and q2 the remainder (at most half a step) in steps 2^8 finer, clamped to 127
// where it rounds to 128. Every activation is within 2^(e - 8) < 2^-13.9 of its group's largest
// (half that but where the remainder lies within 2^(e - 9) of half a step), where the int4 weight
// is up to 2^-5 of its group's range off the float weight it stands for. Three at int8's: x ~ q1
// 2^e + q2 2^(e - 7) + q3 2^(e - 14), 2^(e + 6) the power of two at or above the group's largest
// (|q| <= 64), within 2^(e - 15) <= 2^-20 of it. digits_of in tests/quant/test_quantized_gemm.py
// computes both.
//
// Why: at a decode step's row the float32 path costs three vector instructions per 16 weights
// (unpack, subtract, FMA) and on 2 cores of an Intel Xeon reads int4 at ~21 GB/s, short of the
// memory's speed (42 G weights/s); one vpdpbusd multiplies 64 weights (unsigned bytes) by 64
// activations (signed bytes) and adds them in fours, so 128 weights cost a load, a shift, two masks
// and two dot products a digit: 5 instructions with int8 activations, 7 with two digits, where
// the float32 path takes 24.
//
// Per group and digit the integer sums are exact (|sum| <= 15 * 127 * group < 2^24), and so are
// their float32 conversion and the zero point's share, zero * sum_k q_k: (sum - zero * qsum) *
// (scale * digit scale) is the group's product with one rounding and an FMA a digit, where the
// float32 path rounds at every k. A non-finite activation makes its group's scale NaN: the rows it
// reaches are NaN, as a float32 product's would be, never a finite wrong value.
struct Int8Rows {
  int digits;
  int64_t group, groups, stride;        // group: k a group; stride: bytes a row and digit (whole 32-bit lanes; zeros past K)
  // How the panels read the levels: int4's table holds 16 scale and zero / 16 (unit_of_step 1/16,
  // share_of_sum 16); int8's holds the scale, and its weights are read offset by INT8_WEIGHT_BIAS.
  float unit_of_step, share_of_sum;
  Scratch<Int8Rows> memory;
  float* unit;        // [M][groups][digits]: the digit's scale times unit_of_step
  float* zero_share;  // [M][groups][digits]: share_of_sum sum_k q_k
  int8_t* q;          // [M][digits][stride], zeros past K: int4: a word's k as 0, 2, 4, 6, 1, 3, 5, 7 (its nibbles'); int8: k's order
  Int8Rows(int64_t M, int digits_, int64_t group_, int64_t groups_, int64_t stride_, float unit_of_step_,
           float share_of_sum_)
      : digits(digits_), group(group_), groups(groups_), stride(stride_), unit_of_step(unit_of_step_),
        share_of_sum(share_of_sum_), memory(table_bytes(M) + M * digits_ * stride_), unit(memory.at<float>(0)),
        zero_share(unit + M * groups_ * digits_), q(memory.at<int8_t>(table_bytes(M))) {
    std::memset(q, 0, size_t(M * digits * stride));
  }
  const int32_t* words(int64_t r, int d) const {
    return reinterpret_cast<const int32_t*>(q + (r * digits + d) * stride);
  }

 private:
  int64_t table_bytes(int64_t M) const { return (2 * M * groups * digits * int64_t(sizeof(float)) + 63) / 64 * 64; }
};

// Row r's group g (n activations at x) into `rows` (`digits` 1: int8 activations; 2 or 3: the
// digits, activation_digits), in words (k0 a multiple of 8) or, `words` false, in k's order.
static inline void split_group(Int8Rows& rows, int64_t r, int64_t g, int64_t k0, const float* x, int64_t n,
                               bool words) {
  const int D = rows.digits;
  float* unit = rows.unit + (r * rows.groups + g) * D;
  float* share = rows.zero_share + (r * rows.groups + g) * D;
  float amax = 0.0f;
  bool finite = true;
#if KILN_VEC_BYTES == 64
  auto mask = [&](int64_t i) { return n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1); };
  __m512 most = _mm512_setzero_ps();
  __mmask16 odd = 0;  // lanes that held a NaN (max would drop it)
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(mask(i), x + i);
    odd |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    most = _mm512_max_ps(most, _mm512_abs_ps(v));
  }
  amax = _mm512_reduce_max_ps(most);
  finite = !odd && amax <= std::numeric_limits<float>::max();
#elif KILN_VEC_BYTES == 32 && defined(__AVX2__)
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  auto mask = [&](int64_t i) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::min<int64_t>(8, n - i))), lane); };
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 most = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_maskload_ps(x + i, mask(i));
    odd = _mm256_or_ps(odd, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    most = _mm256_max_ps(most, _mm256_and_ps(v, magnitude));
  }
  __m128 half = _mm_max_ps(_mm256_castps256_ps128(most), _mm256_extractf128_ps(most, 1));
  half = _mm_max_ps(half, _mm_movehl_ps(half, half));
  amax = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
  finite = !_mm256_movemask_ps(odd) && amax <= std::numeric_limits<float>::max();
#else
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
#endif
  // Each digit: levels = round(rest * inverse), rest -= levels * step (D = 1: the int8 scale).
  float inverse[3], step[3];
  if (D == 1) {
    inverse[0] = amax > 0.0f ? 127.0f * (1.0f / amax) : 0.0f;
    step[0] = amax > 0.0f ? amax * (1.0f / 127.0f) : 1.0f;
  } else {
    int top;
    std::frexp(amax, &top);  // amax < 2^top (0: top 0)
    // Two digits of 8 bits: the least e with amax <= 127 * 2^e; three of 7: 2^(e + 6) >= amax.
    const int bits = D == 2 ? 8 : 7;
    const int least = D == 2 ? top - 7 + (amax > std::ldexp(127.0f, top - 7)) : top - 6;
    const int e = std::max(least, -100);  // (tiny groups: digits down to 2^-114, never a denormal scale)
    for (int d = 0; d < D; ++d) {
      step[d] = std::ldexp(1.0f, e - bits * d);
      inverse[d] = std::ldexp(1.0f, bits * d - e);
    }
  }
  int32_t sums[3] = {0, 0, 0};
#if KILN_VEC_BYTES == 64
  const __m512i order = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
  __m512i total[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 in = mask(i);
    __m512 rest = _mm512_maskz_loadu_ps(in, x + i);
    for (int d = 0; d < D; ++d) {
      __m512i level = _mm512_cvtps_epi32(_mm512_mul_ps(rest, _mm512_set1_ps(inverse[d])));
      level = _mm512_min_epi32(_mm512_max_epi32(level, bottom), top);
      if (d + 1 < D) rest = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(level), _mm512_set1_ps(step[d]), rest);
      total[d] = _mm512_add_epi32(total[d], level);
      // In words a partial vector's last word is stored whole (its lanes past n are 0: the load's).
      int8_t* out = rows.q + (r * D + d) * rows.stride + k0 + i;
      if (words) _mm512_mask_cvtepi32_storeu_epi8(out, mask(i - (-(n - i) & 7)), _mm512_permutexvar_epi32(order, level));
      else _mm512_mask_cvtepi32_storeu_epi8(out, in, level);
    }
  }
  for (int d = 0; d < D; ++d) sums[d] = _mm512_reduce_add_epi32(total[d]);
#elif KILN_VEC_BYTES == 32 && defined(__AVX2__)
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  // Byte 0 of each 32-bit lane to the lane's first 4 bytes (each 128-bit half), then the halves' together.
  const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i halves = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
  const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
  __m256i total[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int64_t i = 0; i < n; i += 8) {
    __m256 rest = _mm256_maskload_ps(x + i, mask(i));
    for (int d = 0; d < D; ++d) {
      __m256i level = _mm256_cvtps_epi32(_mm256_mul_ps(rest, _mm256_set1_ps(inverse[d])));
      level = _mm256_min_epi32(_mm256_max_epi32(level, bottom), top);
      if (d + 1 < D) rest = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(level), _mm256_set1_ps(step[d]), rest);
      total[d] = _mm256_add_epi32(total[d], level);
      if (words) level = _mm256_permutevar8x32_epi32(level, order);
      const __m128i bytes = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(level, low_bytes), halves));
      int8_t* out = rows.q + (r * D + d) * rows.stride + k0 + i;
      // In words a vector is a whole word (its lanes past n are 0: the load's); in k's order a
      // group's last, partial vector stores only its own.
      if (words || n - i >= 8) _mm_storel_epi64(reinterpret_cast<__m128i*>(out), bytes);
      else {
        alignas(16) int8_t held[16];
        _mm_store_si128(reinterpret_cast<__m128i*>(held), bytes);
        std::memcpy(out, held, size_t(n - i));
      }
    }
  }
  for (int d = 0; d < D; ++d) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total[d]), _mm256_extracti128_si256(total[d], 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    sums[d] = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    float rest = x[i];
    for (int d = 0; d < D; ++d) {
      const int32_t level = int32_t(std::min(127.0f, std::max(-127.0f, std::nearbyint(rest * inverse[d]))));
      rest = std::fma(-float(level), step[d], rest);
      sums[d] += level;
      rows.q[(r * D + d) * rows.stride + k0 + (words ? i / 8 * 8 + (i % 2) * 4 + (i % 8) / 2 : i)] = int8_t(level);
    }
  }
#endif
  for (int d = 0; d < D; ++d) {
    unit[d] = finite ? step[d] * rows.unit_of_step : std::numeric_limits<float>::quiet_NaN();
    share[d] = rows.share_of_sum * float(sums[d]);
  }
}

// Rows [0, M) of a (K activations each) in `digits` int8 digits per group of `group` k (Int8Rows),
// in words or in k's order, `stride` bytes a row and digit.
static Int8Rows split_rows(int64_t K, int64_t group, int64_t stride, int64_t M, const float* a, int64_t lda,
                           int digits, bool words, float unit_of_step, float share_of_sum) {
  const int64_t groups = (K + group - 1) / group;
  Int8Rows rows(M, digits, group, groups, stride, unit_of_step, share_of_sum);
  auto split_row = [&](int64_t r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * group;
      split_group(rows, r, g, k0, a + r * lda + k0, std::min(K, k0 + group) - k0, words);
    }
  };
  // No parallel region at a decode step's few rows, not even one under a false `if`: libgomp still
  // ends it with a barrier's wake, a futex system call (~0.3 us; 49 products a llama-160m token).
  // Nor inside one (int8_products: each thread splits the rows for itself).
  if (M * K >= (int64_t(1) << 16) && !omp_in_parallel()) {
#pragma omp parallel for num_threads(kiln::team())
    for (int64_t r = 0; r < M; ++r) split_row(r);
  } else {
    for (int64_t r = 0; r < M; ++r) split_row(r);
  }
  return rows;
}

// For int4 panels (the weight's groups; in words, or in k's order).
static Int8Rows split_rows(const QuantShape& z, int64_t M, const float* a, int64_t lda, int digits,
                           bool words = true) {
  return split_rows(z.K, z.group, z.words() * 8, M, a, lda, digits, words, 1.0f / 16.0f, 16.0f);
}

#if (defined(__AVX512VNNI__) && KILN_VEC_BYTES == 64) || (defined(__AVX2__) && KILN_VEC_BYTES == 32) || \
    (defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD))
#define KILN_INT8_DOT 1
constexpr bool INT8_DOT = true;
using IV = kiln::vec<int32_t>;

// acc + the sums in fours of w's unsigned bytes times x's signed ones: vpdpbusd (AVX512-VNNI,
// AVX-VNNI), else AVX2's vpmaddubsw (pairs to 16 bits: |2 * 15 * 127| < 2^15, never saturated) and
// vpmaddwd by ones (pairs of those to 32) and an add: three instructions for one. On aarch64 with
// the dot product instructions (armv8.2-a+dotprod: Neoverse N1 / Graviton2 on), sdot: its signed
// bytes read w's the same, every w being a nibble (0-15).
static inline IV dot4(IV acc, IV w, IV x) {
#if defined(__aarch64__)
  return (IV)vdotq_s32((int32x4_t)acc, (int8x16_t)w, (int8x16_t)x);
#elif KILN_VEC_BYTES == 64
  return (IV)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)w, (__m512i)x);
#elif defined(__AVXVNNI__)
  return (IV)_mm256_dpbusd_avx_epi32((__m256i)acc, (__m256i)w, (__m256i)x);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return (IV)_mm256_dpbusd_epi32((__m256i)acc, (__m256i)w, (__m256i)x);
#else
  return acc + (IV)_mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)w, (__m256i)x), _mm256_set1_epi16(1));
#endif
}

// Whether dot4 is one instruction here (VNNI, AVX-VNNI, aarch64's sdot), not AVX2's three: int8
// weights then take the digits' path at every few rows, not at one only (quant_path_for).
#if defined(__aarch64__) || KILN_VEC_BYTES == 64 || defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
constexpr bool DOT4_ONE_INSTRUCTION = true;
#else
constexpr bool DOT4_ONE_INSTRUCTION = false;
#endif

// The int8 digits a row's activations are carried in (Int8Rows): two of up to 127 levels at int4's
// weights (AVX2's byte pairs: 2 * 15 * 127 < 2^15), within 2^-13.9 of the group's largest where
// the weight is up to 2^-5 of its group's range off; three of up to 64 at int8's, within 2^-20,
// whose weights are finer (2^-8 of a column's largest) and whose byte pairs (0..255) would
// saturate AVX2's 16 bits past 64 levels (2 * 255 * 64 < 2^15). Two against three, 2 threads of
// a 2-core AMD EPYC (Zen 4), kiln's int4 products: 768 x 2304 from L2 at 1/2/3/4 rows
// 15.5/29/51/56 -> 13.6/20/29/41 us; 768 x 32000 from L3 196 -> 175; 4096 x 16384 from DRAM
// 573 -> 543.
static constexpr int activation_digits(int bits) { return bits == 4 ? 2 : 3; }

// int8 weights as dot4 reads them: on x86 its first operand is unsigned, so a quad's bytes are
// read with their sign bits flipped, q + 128 (0..255), and each group's sum takes 128 sum_k x_k
// back out (Int8Rows' zero_share, share_of_sum = INT8_WEIGHT_BIAS); aarch64's sdot reads them signed.
#if defined(__aarch64__)
constexpr float INT8_WEIGHT_BIAS = 0.0f;
static inline IV int8_weight_lanes(IV quads) { return quads; }
#else
constexpr float INT8_WEIGHT_BIAS = 128.0f;
static inline IV int8_weight_lanes(IV quads) { return quads ^ int32_t(0x80808080u); }
#endif

// The activations' groups for int8 weights (one scale per column: the digits' groups are free).
// Their sums stay exact in float32 (|sum| <= 255 * 64 * 256 < 2^24); each group costs a
// conversion and an FMA per digit and vector of sums, 1/64 of its dot products.
constexpr int64_t INT8_DIGIT_GROUP = 256;

// For int8 panels: the digits a group of INT8_DIGIT_GROUP k, in k's order (a quad's bytes).
static Int8Rows split_rows_for_int8(const QuantShape& z, int64_t M, const float* a, int64_t lda) {
  return split_rows(z.K, INT8_DIGIT_GROUP, z.quads() * 4, M, a, lda, activation_digits(8), false, 1.0f,
                    INT8_WEIGHT_BIAS);
}

// C rows [r0, r0 + rows) of panels at[0 .. S) (R rows each; S > 1 only at one row, a run of panels
// as int4_row's), D digits a row, over the groups of `x`. A lane of a panel's row is a 32-bit unit:
// int4 a word (8 k: groups of whole words, a multiple of 8 k), its nibbles masked in place its even
// k's levels as bytes, shifted down 4 its odd k's (Int8Rows stores each row in that order); int8 a
// quad (4 k in k's order, int8_weight_lanes).
// How many groups ahead digits_tile asks for a panel's scales and zero points (the table's lines:
// NR words per group, 192 bytes of int4's beside its 3 KB of weights at groups of 128 and NR = 48,
// read once at the group's end, away from the panels' stream: the hardware's prefetcher did not
// bring them in time). Past a panel's last group the next panel's first, which a one-stream
// thread reads next. A qwen2-0.5b decode step's int4 products from DRAM on 2 MB pages (2 threads
// of a 2-core AMD EPYC, Zen 5; 60 interleaved rounds, the median of each round's ratio):
// 0.824x the time with it and the far prefetch below, 0.884x with the far prefetch alone; on 4 KB
// pages (far prefetches already) 0.98-0.99x; llama-160m's at four rows on 2 MB pages, without it:
// int4 1.11x the time, int8 1.03x. 0: none (to time it).
#ifdef KILN_TABLE_AHEAD
constexpr int64_t TABLE_AHEAD = KILN_TABLE_AHEAD;
#else
constexpr int64_t TABLE_AHEAD = 1;
#endif

// How far ahead (in units: int4 words, int8 quads) digits_tile's far prefetch asks at one row with
// more than one digit where a thread reads its panels in runs (panel_runs: Intel's reading, and
// any CPU's on 4 KB pages; AHEAD elsewhere is INT4_PREFETCH_WORDS). An Intel Xeon with AMX (family
// 6 model 167, 2 threads), Qwen2-0.5B's products from DRAM on 2 MB pages (interleaved rounds, the
// median of each round's time over 32 units'): 16 units int4 0.944-0.952x in four runs, int8
// 0.937-0.949x (12 units: int4 0.943x, int8 0.986x); on 4 KB pages 0.996x and 1.011x. One digit
// (int4 with int8 activations) keeps 32: 16 took 0.99-1.03x its time. The AMD EPYCs read one
// stream a thread on 2 MB pages (huge_page_packs) and keep 32; their runs (4 KB pages, transparent
// huge pages off) were not timed at 16.
#ifdef KILN_RUNS_PREFETCH_UNITS
constexpr int64_t RUNS_PREFETCH_UNITS = KILN_RUNS_PREFETCH_UNITS;
#else
constexpr int64_t RUNS_PREFETCH_UNITS = 16;
#endif

// With the far prefetch into L2, digits_tile's runs (more than one digit) also ask for each line
// NEAR_UNITS units ahead into L1 (`prefetcht0`): the L1's own prefetcher did not bring the runs'
// lines from L2 in time. The same Intel Xeon, Qwen2-0.5B's products on 2 MB pages in runs (16
// interleaved rounds, the median of each round's ratio; benchmarks/tools/quant_decode_sweep.py
// --huge-page-runs KILN_NEAR_UNITS=4): int4 0.974x the time, int8 0.984x (8 units: 0.972x,
// 0.983x); one digit (int4 with int8 activations, its own runs and distance) 0.999x: not asked
// there. 0: none (to time it).
#ifdef KILN_NEAR_UNITS
constexpr int64_t NEAR_UNITS = KILN_NEAR_UNITS;
#else
constexpr int64_t NEAR_UNITS = 4;
#endif

// A group's integer sums into the float sums of rows [r0, r0 + R) of panels at[0 .. S): whole(s,
// v, r, d) the sum of panel s's columns v, row r and digit d (exact whole numbers), its zero
// points' share taken out and scaled by the group's scale and the digit's unit (int4; int8's scale
// waits for the end, store_digit_rows). digits_tile and the AMX tiles' path both add their sums
// here, in this order: their results are the same bits.
template <int BITS, int S, int R, int D, typename Whole>
static inline void add_group_sums(const QuantPanels<BITS>& src, const int64_t* at, int64_t g, const Int8Rows& x,
                                  int64_t r0, Whole&& whole, V (&acc)[S][R][NV]) {
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      // int4: the group's scale and zero point, per column; int8: its one scale, at the end.
      const V scale = BITS == 4 ? src.scale(at[s], g, v) : V{} + 1.0f;
      const V zero = BITS == 4 ? src.zero(at[s], g, v) : V{} + 1.0f;
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
        for (int d = 0; d < D; ++d) {
          const int64_t at_rg = ((r0 + r) * x.groups + g) * D + d;
          const V exact = __builtin_convertvector(whole(s, v, r, d), V) - zero * broadcast(x.zero_share + at_rg);
          acc[s][r][v] = fma(exact, scale * broadcast(x.unit + at_rg), acc[s][r][v]);
        }
    }
}

// The float sums of `rows` rows (from r0) of panels at[0 .. S) to C, int8's column scales first.
// A gated product's (Epilogue::gated_width) panels are stored in pairs: at[s] a gate panel and
// at[s + S / 2] its up panel (gated_pairs), at one row.
template <int BITS, int S, int R>
static inline void store_digit_rows(const QuantPanels<BITS>& src, const int64_t* at, int rows, int64_t r0,
                                    V (&acc)[S][R][NV], void* c, int64_t ldc, const Epilogue* e, bool stream = false) {
  if constexpr (BITS == 8)
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const V scale = src.scale(at[s], 0, v);
        for (int r = 0; r < R; ++r) acc[s][r][v] *= scale;
      }
  if constexpr (S % 2 == 0 && R == 1) {
    if (e && e->gated_width) {
      const bool out_bf16 = e->out_bf16;
      for (int s = 0; s < S / 2; ++s)
        for (int v = 0; v < NV; ++v) {
          const int64_t j = at[s] * NR + v * L;
          const int n = int(std::min<int64_t>(L, e->gated_width - j));
          if (n <= 0) break;
          store_n(const_cast<void*>(kiln_gemm::at(c, out_bf16, r0 * ldc + j)), out_bf16,
                  gated_value(acc[s][0][v], acc[s + S / 2][0][v], j, n, *e), n, stream);
        }
      return;
    }
  }
  for (int s = 0; s < S; ++s)
    store_block<R>(acc[s], rows, int(std::min<int64_t>(NR, src.z.N - at[s] * NR)), r0, at[s] * NR, c, ldc, e, true, stream);
}

template <int BITS, int S, int R, int D, int64_t AHEAD = INT4_PREFETCH_WORDS, int64_t NEAR = 0>
static inline void digits_tile(const QuantPanels<BITS>& src, const int64_t* at, int rows, const Int8Rows& x, void* c,
                               int64_t ldc, const Epilogue* e, int64_t r0 = 0, bool stream = false) {
  const uint8_t* q[S];
  for (int s = 0; s < S; ++s) q[s] = src.panel(at[s]);
  constexpr int K_PER_UNIT = BITS == 4 ? 8 : 4;
  const int64_t units = src.z.rows() / 4, group_units = x.group / K_PER_UNIT;
  // Two sets of sums (int4: even and odd k) where they are few, so that the dot products do not wait on each other.
  constexpr int SETS = BITS == 4 && S * R * D <= 2 ? 2 : 1;
  V acc[S][R][NV];
  for (int s = 0; s < S; ++s) clear(acc[s]);
  for (int64_t g = 0; g < x.groups; ++g) {
    IV sum[SETS][D][S][R][NV] = {};
    if constexpr (TABLE_AHEAD > 0)
      for (int s = 0; s < S; ++s)
        for (int line = 0; line < int(NR * sizeof(float)); line += 64)  // (past the table's end: prefetches never fault)
          __builtin_prefetch(src.table(at[s], g + TABLE_AHEAD) + line, 0, 3);
    for (int64_t u = g * group_units; u < std::min(units, (g + 1) * group_units); ++u) {
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          if constexpr (AHEAD > 0) __builtin_prefetch(q[s] + ((u + AHEAD) * NR + v * L) * 4, 0, FAR_LOCALITY);
          if constexpr (NEAR > 0) __builtin_prefetch(q[s] + ((u + NEAR) * NR + v * L) * 4, 0, 3);
          const IV word = load_words(q[s] + (u * NR + v * L) * 4);
          if constexpr (BITS == 4) {
            // (GFNI's vgf2p8affineqb in place of the shift and mask: 1.02-1.12x the time on Zen 4, from L2/L3.)
            const IV even = word & 0x0F0F0F0F, odd = (word >> 4) & 0x0F0F0F0F;
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
              for (int d = 0; d < D; ++d) {
                const int32_t* xr = x.words(r0 + r, d) + 2 * u;
                sum[0][d][s][r][v] = dot4(sum[0][d][s][r][v], even, IV{} + xr[0]);
                sum[SETS - 1][d][s][r][v] = dot4(sum[SETS - 1][d][s][r][v], odd, IV{} + xr[1]);
              }
          } else {
            const IV w = int8_weight_lanes(word);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
              for (int d = 0; d < D; ++d) sum[0][d][s][r][v] = dot4(sum[0][d][s][r][v], w, IV{} + x.words(r0 + r, d)[u]);
          }
        }
    }
    add_group_sums<BITS, S, R, D>(src, at, g, x, r0, [&](int s, int v, int r, int d) {
      return SETS == 2 ? sum[0][d][s][r][v] + sum[SETS - 1][d][s][r][v] : sum[0][d][s][r][v];
    }, acc);
  }
  store_digit_rows<BITS, S, R>(src, at, rows, r0, acc, c, ldc, e, stream);
}

// Whether int8 weights at one row on 2 MB pages (one stream a thread, below) are also asked for
// INT4_PREFETCH_WORDS units ahead, as int4's are. Not on AMD's family 19h (Zen 3, Zen 4): on a
// 2-core AMD EPYC Zen 4 (family 25 model 17; 2 threads, benchmarks/tools/quant_decode_sweep.py
// --huge-pages --in-c, 40 interleaved rounds, the median of each round's ratio) a step's int8
// products took 0.733x the time without it for Qwen2-0.5B (quartiles 0.694-0.777; 1 KB ahead
// 0.750x) and 0.918x for llama-160m, where int4's stayed within noise (1.01-1.08x): a plain read
// of 1 GiB there ran 17 % slower with prefetcht1 4-8 KB ahead of its loads, 2 % at 1-2 KB. Zen 5
// (family 26) keeps it: it is where the far prefetch was timed faster (int8 0.94-0.95x with the
// table's prefetch). KILN_INT8_FAR_PREFETCH=0/1 times either anywhere.
#ifdef KILN_INT8_FAR_PREFETCH
static inline bool int8_far_prefetch() { return KILN_INT8_FAR_PREFETCH != 0; }
#elif defined(__x86_64__)
static inline bool int8_far_prefetch() {
  static const bool far = [] {
    __builtin_cpu_init();
    return !__builtin_cpu_is("amdfam19h");
  }();
  return far;
}
#else
static inline bool int8_far_prefetch() { return true; }
#endif

// Runs of panels a thread reads at once at one row with more than one digit (their sums fill the registers).
// A gated product's (Epilogue::gated_width) pairs [i0, i1) in RUNS runs at one row: f(count, at)
// with at[0, n) gate panels, one from each run, and at[n, 2n) their up panels (`half` panels on),
// count 2n: each thread reads the gate's and up's columns of the same outputs, and stores those
// outputs once (store_digit_rows).
template <typename F> static inline auto gate_and_up(int64_t half, F& f) {
  return [&f, half](auto count, const int64_t* gates) {
    constexpr int n = decltype(count)::value;
    int64_t at[2 * n];
    for (int s = 0; s < n; ++s) at[s] = gates[s], at[n + s] = half + gates[s];
    f(std::integral_constant<int, 2 * n>{}, at);
  };
}
template <int RUNS, typename F> static inline void gated_pairs(int64_t i0, int64_t i1, int64_t half, F&& f) {
  panel_runs<RUNS>(i0, i1, gate_and_up(half, f));
}

// How many runs a thread reads side by side at one row with more than one digit (a gated
// product's pairs: half as many runs of two panels). Qwen2-0.5B's int4 products from DRAM on 2 MB
// pages read in runs, 2 threads of the Intel Xeon with AMX (family 6 model 167; quant_decode_sweep.py
// --in-c --huge-page-runs, 20 interleaved rounds, the median of each round's ratio): one run 1.100x
// the time of two (quartiles 1.086-1.126), four 1.003x (0.971-1.024).
#ifdef KILN_DIGIT_RUNS  // to time another count
constexpr int DIGIT_RUNS = KILN_DIGIT_RUNS;
#else
constexpr int DIGIT_RUNS = 2;
#endif
// At one row in runs, each thread reads its share of all but the last 1/RESERVE_PARTS of a
// product's units (panels, a gated product's pairs), then the threads take that reserve a step of
// runs at a time (an atomic count) as they finish: the threads' streams do not run at one speed.
// Qwen2-0.5B's int4 decode graph on the Intel Xeon with AMX (2 threads, rdtsc in each thread): with
// every unit split statically the main thread waited for the other at the end of every long
// product, 8.5 us of gate/up's ~140, 108 of the LM head's ~2100 (docs/generation.md, a
// twenty-sixth session). The graph's time over the static split's (decode_breakdown.py, processes
// alternated; the median of the rounds' ratios): a reserve of 1/24 0.967x and 0.974x in two series
// of 6 and 8 rounds, 1/48 0.976x (8), 1/12 0.997x (6). A thread starts its streams cold in each
// step it takes of the reserve: hence a short one, and only where a product has RESERVE_MIN_UNITS
// units (Qwen2-0.5B's gate/up 101 pairs and LM head 3166 panels; not its q/k/v, o or down, 19-24).
// 0: no reserve (to time it).
#ifdef KILN_RESERVE_PARTS
constexpr int64_t RESERVE_PARTS = KILN_RESERVE_PARTS;
#else
constexpr int64_t RESERVE_PARTS = 24;
#endif
constexpr int64_t RESERVE_MIN_UNITS = 32;
// C = epilogue(rows @ B) over every panel, the threads splitting them; one row in runs. `split()`
// makes the rows' digits (Int8Rows): every thread makes its own, inside the parallel region. Made
// once by the calling thread, the others waited for it and then read its digits from the other
// core's cache: of an int4 product's fixed cost at one row (768 x 768 from L2, 2 threads of a
// 2-core AMD EPYC, Zen 4: ~3 us where the same on one thread has ~0.5), most was that hand-over,
// not the split (768 x 2304: 15.2 -> 12.1 us with the panels shared as below).
template <int BITS, int D, typename Split>
static void int8_products(const QuantPanels<BITS>& src, int64_t M, Split&& split, void* c, int64_t ldc,
                          const Epilogue* e) {
  const int64_t panels = src.z.panels();
  const bool worth_threads = panels > 1 && 2 * M * src.z.N * src.z.K >= (int64_t(1) << 18);
  const int team = worth_threads && !omp_in_parallel() ? kiln::team() : 1;
  // A gated product (at one row only: gemm_quant_direct, gemm_quant_int8_activations) splits its
  // pairs of panels, a gate's and its up's, between the threads.
  const bool pairs = gated(e);
  const int64_t units = pairs ? panels / 2 : panels;
  SharedPanels shared(units, team);
  // Runs of 4 panels with one digit (as int4_row), 2 with more: their sums fill the registers (a
  // gated product's: half as many runs of pairs, at least one: KILN_DIGIT_RUNS=1 times one stream).
  constexpr int RUNS = D == 1 ? INT4_RUNS : DIGIT_RUNS, PAIR_RUNS = RUNS > 1 ? RUNS / 2 : 1;
  const bool one_stream = M == 1 && huge_page_packs.load(std::memory_order_relaxed);
  // A long one-row product's last units read in runs, the reserve, go to whichever thread is done
  // first (RESERVE_PARTS).
  const int64_t reserve =
      M == 1 && !one_stream && team > 1 && RESERVE_PARTS > 0 && units >= RESERVE_MIN_UNITS ? units / RESERVE_PARTS : 0;
  std::atomic<int64_t> reserve_taken{0};
  const bool stream = stream_row_output(M, pairs ? e->gated_width : src.z.N, c, ldc, e);
  parallel_team(worth_threads, [&](int threads, int thread) {
    const Int8Rows x = split();
    int64_t p0, p1;
    range(units - reserve, threads, thread, p0, p1);
    if (one_stream) {
      // Over panels on 2 MB pages (kiln_gemm.h `huge_page_packs`: kiln's packs on AMD where THP is
      // on) one stream a thread: the hardware's prefetcher follows it across the whole range. 40
      // int4 products 768x6144 from DRAM, 2 threads of a 2-core AMD EPYC (Zen 4), 9 interleaved
      // rounds: 3.60 -> 3.28 ms on 2 MB pages (2 runs with the far prefetches -> 1 run without); on
      // 4 KB pages the same change cost 2 % (3.91 -> 3.98). A llama-160m step's int4 products with
      // int8 activations (one digit; 9 interleaved rounds): 4 runs with the far prefetches 1.65 ms,
      // 1 run without 1.43; its int8 weights' digits: 2 runs 3.48, 1 run 2.54. One run with the far
      // prefetches, not timed there, is faster again on Zen 5 (2 MB pages, 60 interleaved rounds,
      // the median of the rounds' ratios; with the table's prefetch, TABLE_AHEAD): llama-160m's
      // step int4 0.84x the time, int8 0.94x; qwen2-0.5b's int4 0.82x, int8 0.95x, int4 with int8
      // activations 0.88x (benchmarks/tools/quant_decode_sweep.py --huge-pages; 2 runs with the far
      // prefetches, no table prefetch: 1.05x).
      // The panels shared (SharedPanels): a llama-160m step's int4 products from DRAM where the
      // memory read >= 45 GB/s (~480 interleaved rounds each) 70 -> 77 % of its speed with the
      // digits made on each thread (74 % with them and a static split); in another run 87 -> 94 %.
      const bool far = BITS == 4 || int8_far_prefetch();
      auto tile = [&](auto count, const int64_t* at) {
        if (far) digits_tile<BITS, decltype(count)::value, 1, D>(src, at, 1, x, c, ldc, e, 0, stream);
        else if constexpr (BITS == 8) digits_tile<BITS, decltype(count)::value, 1, D, 0>(src, at, 1, x, c, ldc, e, 0, stream);  // (int4 never)
      };
      shared.take_all(thread, [&](int64_t q0, int64_t q1) {
        if (pairs) gated_pairs<1>(q0, q1, units, tile);
        else panel_runs<1>(q0, q1, tile);
      });
    } else if (M == 1) {
      auto tile = [&](auto count, const int64_t* at) {
        digits_tile<BITS, decltype(count)::value, 1, D, D == 1 ? INT4_PREFETCH_WORDS : RUNS_PREFETCH_UNITS,
                    D == 1 ? 0 : NEAR_UNITS>(src, at, 1, x, c, ldc, e, 0, stream);
      };
      if (pairs) gated_pairs<PAIR_RUNS>(p0, p1, units, tile);
      else panel_runs<RUNS>(p0, p1, tile);
      if (reserve) {
        const int64_t r0 = units - reserve, steps = run_steps(r0, units, pairs ? PAIR_RUNS : RUNS);
        for (int64_t i; (i = reserve_taken.fetch_add(1, std::memory_order_relaxed)) < steps;) {
          if (pairs) run_step<PAIR_RUNS>(r0, units, i, gate_and_up(units, tile));
          else run_step<RUNS>(r0, units, i, tile);
        }
      }
    } else {
      for (int64_t p = p0; p < p1; ++p) {
        if (D == 3 && M == 4) {
          // Three digits of four rows keep 36 sets of sums, more than the registers: two rows at a
          // time, the panel's words read again from L1 (768x2304 from L2, 2 threads of the Intel
          // Xeon: 70 -> 58 us; at three rows, 2 + 1 measured the same as 3).
          digits_tile<BITS, 1, 2, D>(src, &p, 2, x, c, ldc, e, 0, stream);
          digits_tile<BITS, 1, 2, D>(src, &p, 2, x, c, ldc, e, 2, stream);
          continue;
        }
        switch (M) {
          case 2: digits_tile<BITS, 1, 2, D>(src, &p, 2, x, c, ldc, e, 0, stream); break;
          case 3: digits_tile<BITS, 1, 3, D>(src, &p, 3, x, c, ldc, e, 0, stream); break;
          default: digits_tile<BITS, 1, 4, D>(src, &p, int(M), x, c, ldc, e, 0, stream); break;
        }
      }
    }
    if (stream) kiln::store_stream_fence();
  }, shared.threads());
  normalize_rows(M, src.z.N, c, ldc, e);
}

#ifndef KILN_AMX_FEW  // (0: the digits path at every few rows, to time it against this one)
#define KILN_AMX_FEW 1
#endif
#if defined(KILN_GEMM_AMX) && defined(__AMX_INT8__) && KILN_AMX_FEW
// ---- int8 and int4 weights at four rows on AMX's integer tiles: TDPBSSD ----
//
// At four rows the digits path above is bound by its dot products, not by memory: three digits
// of four rows are 12 vpdpbusd per 64 bytes of weights, their 36 sums more than the registers (two
// passes of two rows), and a Qwen2-0.5B step's int8 products took 24-25 ms where a plain read of
// their packs takes 13-15 (generation.md). One TDPBSSD multiplies a 16 x 64 tile of signed bytes
// by a 64 x 16 one and adds them in fours into a 16 x 16 tile of int32: a panel's 64 k of 48
// columns for every row and digit (M x D: int8 at four rows 12 tile rows, int4 8) in three. The packed quads are already
// the B tile AMX reads ([K/4][NR] 32-bit lanes: 16 quad rows of 16 columns, NR lanes apart), read
// signed as they are stored (no bias to take back out); A's tile is the rows' digits (Int8Rows, in
// k's order: row r's digit d is tile row 3r + d), the same digits over the same groups of
// INT8_DIGIT_GROUP k as the digits path, so each group's integer sums are the same whole numbers
// and go into the float sums in the same order: the two paths' results are the same bits. A
// group's sums leave the tiles at its end (three tiles a panel stored, then converted and scaled
// per row and digit, as digits_tile's). Two panels a thread at once (their six C tiles, A's and
// B's: the eight tiles); a last chunk past the panel's quads comes from a zeroed copy (a tile
// never reads past its operand). int4's words are widened first, a chunk of 8 words a panel into
// this thread's copy (widen_words: each word's even k's nibbles as bytes in one B row, its odd k's
// in the next, the digits' order in words), and each group's sums scaled with its zero points as
// digits_tile's are: the digits path's bits too. Where it runs by default: AMX_FEW_ROWS. Linux's
// permission for the tiles as for kiln_gemm_amx.h's (amx_usable).
#define KILN_QUANT_AMX_FEW 1
#ifdef KILN_AMX_INT8_AHEAD  // to time another distance (chunks; 0: none)
constexpr int64_t AMX_INT8_AHEAD = KILN_AMX_INT8_AHEAD;
#else
constexpr int64_t AMX_INT8_AHEAD = 1;
#endif
// A chunk: 64 k, the 16 rows of 4 k a B tile holds per column; its three tiles (a panel's 48
// columns) are 16 rows of NR * 4 bytes.
constexpr int64_t AMX_CHUNK_K = 64, AMX_CHUNK_ROWS = 16, AMX_B_STRIDE = NR * 4,
                  AMX_CHUNK_BYTES = AMX_CHUNK_ROWS * AMX_B_STRIDE;

// Whether a product of M rows can run on AMX's integer tiles: 2 to DIRECT_ROWS rows, a CPU and
// kernel that give the tiles; int4's groups whole chunks (a group's sums leave the tiles at a
// chunk's end). Sums fit int32: |sum| <= 127 * 64 * 256 a group of int8's, 15 * 127 * group int4's.
static inline bool amx_few_rows_apply(const QuantShape& z, int64_t M) {
  static_assert(NR == 48, "a panel is three tiles of 16 columns");
  return M >= 2 && M <= DIRECT_ROWS && (z.bits == 8 || z.group % AMX_CHUNK_K == 0) && amx_usable();
}

// The rows that take them by default: four only. Qwen2-0.5B's step of int8 products from DRAM (2
// threads of an Intel Xeon with AMX, family 6 model 167, 2 MB pages read in runs, 10 interleaved
// rounds; benchmarks/tools/quant_decode_sweep.py --in-c --huge-page-runs KILN_AMX_FEW=0): at
// four rows 21.0 ms on the tiles against 24.0 on vpdpbusd (whose 36 sums of four rows' three
// digits exceed the registers: two passes of two rows); at two and three rows vpdpbusd's one pass
// is faster, 17.9 and 16.7 ms against 19.1 and 19.8. The tiles read int8's panels at ~25 GB/s
// at every row count (a plain read of the packs: 39), and no faster without their products
// (timed). A standalone loop of the same tile loads and products over one buffer, two streams a
// thread, loads every byte at ~32 GB/s (as vector loads do) where kiln's line reader, a load a
// line, reads 39 at that hour, and at ~28 with a group's sums stored and scaled every 4 chunks;
// this path (24.4 then) is ~88 % of that loop. The prefetches into L1 one chunk ahead,
// each tile's lines just before its load, were the fastest of those timed (into L2, burst, 2-8
// chunks ahead: 1.04-1.14x the time). int4's (groups of 128, KILN_AMX_FEW=0 and KILN_AMX_FEW_ROWS=2
// builds against this one in one run): four rows 11.0 ms on the tiles, 11.7 on vpdpbusd; two rows
// 9.13 and 9.23, even (int8 there 19.6 and 18.3).
#ifdef KILN_AMX_FEW_ROWS  // (to time other rows)
constexpr int64_t AMX_FEW_ROWS = KILN_AMX_FEW_ROWS;
#else
constexpr int64_t AMX_FEW_ROWS = 4;
#endif

// int4: the words [w0, w1) of a panel (8 k of each column, nibble j k j) as a chunk's B rows at
// `out`: word w's even k (0, 2, 4, 6: the digits' order in words) in row 2 (w - w0), its odd k in
// the next, one byte each (0..15); each word row asked for RUNS_PREFETCH_UNITS words ahead.
static inline void widen_words(const uint8_t* panel, int64_t w0, int64_t w1, uint8_t* out) {
  for (int64_t w = w0; w < w1; ++w)
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) {
      __builtin_prefetch(panel + ((w + RUNS_PREFETCH_UNITS) * NR + v * L) * 4, 0, FAR_LOCALITY);
      const IV word = load_words(panel + (w * NR + v * L) * 4);
      const IV even = word & 0x0F0F0F0F, odd = (word >> 4) & 0x0F0F0F0F;
      std::memcpy(out + 2 * (w - w0) * AMX_B_STRIDE + v * L * 4, &even, sizeof even);
      std::memcpy(out + (2 * (w - w0) + 1) * AMX_B_STRIDE + v * L * 4, &odd, sizeof odd);
    }
}

// Rows [0, R) of panels at[0 .. S) (S 1 or 2): tiles 0-2 the first panel's C, 3-5 the second's,
// 6 A's, 7 B's (the tile numbers are literal: the intrinsics paste them into their instructions).
// `scratch`: 2 chunks of this thread's (zeroed where int8's last chunk is copied).
template <int BITS, int S, int R>
static inline void amx_digits_run(const QuantPanels<BITS>& src, const int64_t* at, const Int8Rows& x,
                                  uint8_t* scratch, void* c, int64_t ldc, const Epilogue* e) {
  constexpr int D = activation_digits(BITS);
  constexpr int64_t CHUNK_UNITS = BITS == 8 ? AMX_CHUNK_ROWS : AMX_CHUNK_ROWS / 2;  // int8 quads, int4 words
  const int64_t units = src.z.rows() / 4, chunks = (units + CHUNK_UNITS - 1) / CHUNK_UNITS,
                group_chunks = x.group / AMX_CHUNK_K;
  const uint8_t* q[S];
  for (int s = 0; s < S; ++s) q[s] = src.panel(at[s]);
  // int8's panels are read as they lie, but for a last chunk past their quads: from a copy.
  const int64_t tail_bytes = (units - (chunks - 1) * CHUNK_UNITS) * AMX_B_STRIDE;
  if (BITS == 8 && tail_bytes < AMX_CHUNK_BYTES)  // (the rest stays zero: every panel's tail is as long)
    for (int s = 0; s < S; ++s)
      std::memcpy(scratch + s * AMX_CHUNK_BYTES, q[s] + (chunks - 1) * AMX_CHUNK_BYTES, tail_bytes);
  V acc[S][R][NV];
  for (int s = 0; s < S; ++s) clear(acc[s]);
  alignas(64) int32_t sums[S][NV][16 * L];  // a group's C tiles: tile row i, column j at [i * 16 + j]
  for (int64_t g = 0; g < x.groups; ++g) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    if constexpr (S == 2) {
      _tile_zero(3);
      _tile_zero(4);
      _tile_zero(5);
    }
    for (int64_t u = g * group_chunks; u < std::min(chunks, (g + 1) * group_chunks); ++u) {
      const uint8_t* b[S];
      for (int s = 0; s < S; ++s) {
        if constexpr (BITS == 4) {
          widen_words(q[s], u * CHUNK_UNITS, std::min(units, (u + 1) * CHUNK_UNITS), scratch + s * AMX_CHUNK_BYTES);
          b[s] = scratch + s * AMX_CHUNK_BYTES;  // (rows past the panel's words: the last chunk's, times A's zeros)
        } else {
          b[s] = u + 1 == chunks && tail_bytes < AMX_CHUNK_BYTES ? scratch + s * AMX_CHUNK_BYTES : q[s] + u * AMX_CHUNK_BYTES;
        }
      }
      // int8: each B tile's 16 lines AMX_INT8_AHEAD chunks ahead into L1, asked for just before
      // the tile's load (past the panel: prefetches never fault).
      auto ask_ahead = [&](int s, int t) {
        if constexpr (BITS == 8 && AMX_INT8_AHEAD > 0)
          for (int row = 0; row < 16; ++row)
            __builtin_prefetch(q[s] + (u + AMX_INT8_AHEAD) * AMX_CHUNK_BYTES + row * AMX_B_STRIDE + t * 64, 0, 3);
      };
      _tile_loadd(6, x.q + u * AMX_CHUNK_K, x.stride);
      ask_ahead(0, 0);
      _tile_loadd(7, b[0], AMX_B_STRIDE);
      _tile_dpbssd(0, 6, 7);
      ask_ahead(0, 1);
      _tile_loadd(7, b[0] + 64, AMX_B_STRIDE);
      _tile_dpbssd(1, 6, 7);
      ask_ahead(0, 2);
      _tile_loadd(7, b[0] + 128, AMX_B_STRIDE);
      _tile_dpbssd(2, 6, 7);
      if constexpr (S == 2) {
        ask_ahead(S - 1, 0);
        _tile_loadd(7, b[S - 1], AMX_B_STRIDE);
        _tile_dpbssd(3, 6, 7);
        ask_ahead(S - 1, 1);
        _tile_loadd(7, b[S - 1] + 64, AMX_B_STRIDE);
        _tile_dpbssd(4, 6, 7);
        ask_ahead(S - 1, 2);
        _tile_loadd(7, b[S - 1] + 128, AMX_B_STRIDE);
        _tile_dpbssd(5, 6, 7);
      }
    }
    _tile_stored(0, sums[0][0], 64);
    _tile_stored(1, sums[0][1], 64);
    _tile_stored(2, sums[0][2], 64);
    if constexpr (S == 2) {
      _tile_stored(3, sums[S - 1][0], 64);
      _tile_stored(4, sums[S - 1][1], 64);
      _tile_stored(5, sums[S - 1][2], 64);
    }
    // As digits_tile's sums (the same whole numbers: int8's weights' bias never added here, its
    // zero_share 0), scaled in its order.
    add_group_sums<BITS, S, R, D>(src, at, g, x, 0, [&](int s, int v, int r, int d) {
      IV whole;
      std::memcpy(&whole, sums[s][v] + (r * D + d) * 16, sizeof whole);
      return whole;
    }, acc);
  }
  store_digit_rows<BITS, S, R>(src, at, R, 0, acc, c, ldc, e);
}

// C = epilogue(A @ B) of M (2 to DIRECT_ROWS) rows over int8 or int4 panels on AMX
// (amx_few_rows_apply), the threads splitting the panels, each making the rows' digits for itself
// (as int8_products), A's rows to whole chunks (zeros past K: A's tile never reads past them).
template <int BITS>
static void amx_digits_products(const QuantPanels<BITS>& src, int64_t M, const float* a, int64_t lda, void* c,
                                int64_t ldc, const Epilogue* e) {
  const int64_t panels = src.z.panels();
  const bool worth_threads = panels > 1 && 2 * M * src.z.N * src.z.K >= (int64_t(1) << 18);
  const int64_t k_lanes = BITS == 8 ? src.z.quads() * 4 : src.z.words() * 8;  // (K to whole 32-bit lanes)
  const int64_t stride = (k_lanes + AMX_CHUNK_K - 1) / AMX_CHUNK_K * AMX_CHUNK_K;
  constexpr int D = activation_digits(BITS);
#pragma omp parallel if (worth_threads) num_threads(kiln::team())
  {
    const Int8Rows x = BITS == 8 ? split_rows(src.z.K, INT8_DIGIT_GROUP, stride, M, a, lda, D, false, 1.0f, 0.0f)
                                 : split_rows(src.z.K, src.z.group, stride, M, a, lda, D, true, 1.0f / 16.0f, 16.0f);
    AmxConfig config;
    for (int t = 0; t < 7; ++t) config.rows[t] = uint8_t(M * D);  // C's and A's; B's 16
    _tile_loadconfig(&config);
    alignas(64) uint8_t scratch[2 * AMX_CHUNK_BYTES] = {};
    int64_t p0, p1;
    range(panels, omp_get_num_threads(), omp_get_thread_num(), p0, p1);
    panel_runs<2>(p0, p1, [&](auto count, const int64_t* at) {
      constexpr int S = decltype(count)::value;
      switch (M) {
        case 2: amx_digits_run<BITS, S, 2>(src, at, x, scratch, c, ldc, e); break;
        case 3: amx_digits_run<BITS, S, 3>(src, at, x, scratch, c, ldc, e); break;
        default: amx_digits_run<BITS, S, 4>(src, at, x, scratch, c, ldc, e); break;
      }
    });
    _tile_release();
  }
  normalize_rows(M, src.z.N, c, ldc, e);
}
#endif
#else
#define KILN_INT8_DOT 0
constexpr bool INT8_DOT = false;
constexpr bool DOT4_ONE_INSTRUCTION = false;
static constexpr int activation_digits(int) { return 0; }  // (no digits path)
#endif

// The paths of a product at a few rows: the float32 one (direct_tile, int8_row, int4_row), int4's
// bfloat16 pairs (direct_tile_bf16: CPUs with avx512_bf16), the int8 digits (digits_tile:
// CPUs with AVX512-VNNI, AVX-VNNI or AVX2, aarch64 with the dot product instructions). Which one
// runs changes the result within the bounds given with each.
enum QuantPath : int { PATH_FLOAT32 = 0, PATH_BF16_PAIRS = 1, PATH_INT8_DIGITS = 2, QUANT_PATHS = 3 };
// More rows: the float32 GEMM over dequantized blocks, or AMX's tiles (int8's levels: gemm_quant_amx).
constexpr int PATH_AMX = 3;

// Whether `path` can run for this shape: int4's groups of whole words, a CPU with its instructions.
static inline bool quant_path_applies(const QuantShape& z, int path) {
  if (path == PATH_FLOAT32) return true;
  if (z.bits == 8) return path == PATH_INT8_DIGITS && INT8_DOT;
  if (z.group % 8) return false;
#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
  if (path == PATH_BF16_PAIRS) return true;
#endif
  return path == PATH_INT8_DIGITS && INT8_DOT;
}

// Whether int4's integer (dot4) path with int8 activations can run: digits_tile's CPUs and groups,
// a decode step's few rows.
static inline bool int8_dot_applies(const QuantShape& z, int64_t M) {
  return z.bits == 4 && quant_path_applies(z, PATH_INT8_DIGITS) && M <= DIRECT_ROWS;
}

template <int BITS>
static void gemm_quant_direct(const QuantPanels<BITS>& src, int64_t M, const float* a, int64_t lda, void* c,
                              int64_t ldc, const Epilogue* e, int path);

// The fastest of int4's paths on this CPU at one row (`rows` 1) or at 2 to 4 (`rows` 4): measured
// once per process each, on a 768 x 2304 weight in L2 (where instructions, not memory, decide),
// best of 5 each, ~3 ms at one row. Where vdpbf16ps runs at the FMA's rate (Zen 4) the pairs path
// makes 32 weights in two instructions where the float32 path takes three per 16: 39 against 26 G
// weights/s a core; where it runs at half that rate (2 threads of an Intel Xeon, family 6 model
// 207) the pairs path took 61 us at one row and the float32 path 41, the digits 20-23; at 4 rows
// 193, 72 and 60 (built for AVX2 instead, the digits lose at 4 rows: 162 against 123).
static int int4_fastest_path(int rows) {
  auto measure = [](int64_t M) {
    const QuantShape z{4, 768, 2304, 128};
    // Packed as a model's weights are (pack_quant), so that the paths read the layout they will
    // read: any levels, one scale and zero point.
    const int64_t stored = z.N * ((z.K + 1) / 2), tables = z.N * z.groups();
    std::unique_ptr<uint8_t[]> q(new uint8_t[stored]), packed(new uint8_t[z.bytes()]);
    for (int64_t i = 0; i < stored; ++i) q[i] = uint8_t(i * 2654435761u >> 13);
    std::unique_ptr<float[]> scales(new float[tables]), zeros(new float[tables]);
    std::fill(scales.get(), scales.get() + tables, 0.01f);
    std::fill(zeros.get(), zeros.get() + tables, 8.0f);
    pack_quant(z, q.get(), scales.get(), zeros.get(), packed.get());
    std::unique_ptr<float[]> a(new float[M * z.K]), c(new float[M * z.N]);
    for (int64_t k = 0; k < M * z.K; ++k) a[k] = float(k % 7) - 3.0f;
    double best[QUANT_PATHS] = {1e9, 1e9, 1e9};
    int applicable = 0;
    for (int path = 0; path < QUANT_PATHS; ++path) applicable += quant_path_applies(z, path);
    if (applicable == 1) return int(PATH_FLOAT32);  // (SSE, NEON: nothing to choose between)
    for (int round = 0; round < 6; ++round)
      for (int path = 0; path < QUANT_PATHS; ++path) {
        if (!quant_path_applies(z, path)) continue;
        const auto start = std::chrono::steady_clock::now();
        gemm_quant_direct(QuantPanels<4>{z, packed.get()}, M, a.get(), z.K, c.get(), z.N, nullptr, path);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (round > 0) best[path] = std::min(best[path], seconds);  // (round 0 warms the caches)
      }
    return int(std::min_element(best, best + QUANT_PATHS) - best);
  };
  if (rows == 1) {
    static const int one = measure(1);
    return one;
  }
  static const int few = measure(4);
  return few;
}

// Whether `path` at a few rows is int8_products' (the activations' digits, vpdpbusd).
static inline bool takes_digits(const QuantShape& z, int path) {
  return KILN_INT8_DOT && (path == PATH_INT8_DIGITS || path == PATH_AMX) && quant_path_applies(z, PATH_INT8_DIGITS);
}

// A gated product (Epilogue::gated_width) that its path does not store in pairs itself (every path
// but int8_products at one row: a decode step's): `product(sums, ld)` writes the plain sums [M, N]
// of both halves, then each row's outputs are made from them as the paired store makes them.
template <typename Product>
static void gated_apart(const QuantShape& z, int64_t M, void* c, int64_t ldc, const Epilogue& e, Product&& product) {
  const int64_t N = z.N, half = N / 2, H = e.gated_width;
  const std::unique_ptr<float[]> sums(new float[M * N]);
  product(sums.get(), N);
#pragma omp parallel for if (M * H >= (int64_t(1) << 16)) num_threads(kiln::team())
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < H; j += L) {
      const int n = int(std::min<int64_t>(L, H - j));
      const float* row = sums.get() + r * N;
      const V y = gated_value(load_n(row + j, false, n), load_n(row + half + j, false, n), j, n, e);
      store_n(const_cast<void*>(at(c, e.out_bf16, r * ldc + j)), e.out_bf16, y, n);
    }
}

template <int BITS>
static void gemm_quant_direct(const QuantPanels<BITS>& src, int64_t M, const float* a, int64_t lda, void* c,
                              int64_t ldc, const Epilogue* e, int path) {
  if (gated(e) && !(M == 1 && takes_digits(src.z, path)))
    return gated_apart(src.z, M, c, ldc, *e, [&](float* sums, int64_t ld) {
      gemm_quant_direct(src, M, a, lda, sums, ld, nullptr, path);
    });
  const int64_t N = src.z.N, K = src.z.K, panels = src.z.panels(), groups = src.z.groups();
#ifdef KILN_QUANT_AMX_FEW
  if (path == PATH_AMX && amx_few_rows_apply(src.z, M)) return amx_digits_products(src, M, a, lda, c, ldc, e);
#endif
#if KILN_INT8_DOT
  if (takes_digits(src.z, path)) {
    constexpr int D = activation_digits(BITS);
    if constexpr (BITS == 4) return int8_products<4, D>(src, M, [&] { return split_rows(src.z, M, a, lda, D); }, c, ldc, e);
    else return int8_products<8, D>(src, M, [&] { return split_rows_for_int8(src.z, M, a, lda); }, c, ldc, e);
  }
#endif
  const bool bf16_pairs = path == PATH_BF16_PAIRS && quant_path_applies(src.z, path);
  // int4: each row's sum of a over each group (the zero points' share), once for every panel (the
  // bfloat16 path sums its split activations instead, as it makes them).
  float asums[DIRECT_ROWS * 64];
  std::unique_ptr<float[]> large;
  float* sums = asums;
  if (BITS == 4) {
    if (M * groups > DIRECT_ROWS * 64) large.reset(sums = new float[M * groups]);
    for (int64_t r = 0; r < M && !bf16_pairs; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        float total = 0.0f;
        for (int64_t k = g * src.z.group; k < std::min(K, (g + 1) * src.z.group); ++k) total += a[r * lda + k];
        sums[r * groups + g] = total;
      }
  }
  // tile(R, p, rows, cols) for every panel, R the rows as a compile-time constant, the threads
  // splitting the panels. Every row in one pass over the panel's bytes (in pairs of rows, a second
  // pass from L2 measured slower at 4 rows: 16 MB of int8 weights 0.79 -> 1.03 ms on 2 threads).
  const bool worth_threads = panels > 1 && 2 * M * N * K >= (int64_t(1) << 18);
  if (M == 1 && (BITS == 8 ? groups == 1 : !bf16_pairs && src.z.group % 8 == 0)) {  // one row, in runs
    // The row to whole 32-bit lanes (int8_row reads 4 k a quad, int4_row 8 a word).
    struct PaddedRow;
    const int64_t lanes = src.z.rows() / 4 * (BITS == 8 ? 4 : 8);
    const Scratch<PaddedRow> memory(lanes * int64_t(sizeof(float)));
    float* padded = memory.template at<float>(0);
    std::memcpy(padded, a, K * sizeof(float));
    std::memset(padded + K, 0, (lanes - K) * sizeof(float));
    parallel_team(worth_threads, [&](int threads, int thread) {
      int64_t p0, p1;
      range(panels, threads, thread, p0, p1);
      if constexpr (BITS == 8)
        panel_runs(p0, p1, [&](auto count, const int64_t* at) { int8_row<decltype(count)::value>(src, at, padded, c, ldc, e); });
      else
        panel_runs<INT4_RUNS>(p0, p1, [&](auto count, const int64_t* at) {
          int4_row<decltype(count)::value>(src, at, padded, sums, c, ldc, e);
        });
    });
    normalize_rows(M, N, c, ldc, e);
    return;
  }
  auto each_panel = [&](auto tile) {
    parallel_team(worth_threads, [&](int threads, int thread) {
      int64_t p0, p1;
      range(panels, threads, thread, p0, p1);
      for (int64_t p = p0; p < p1; ++p) {
        const int cols = int(std::min<int64_t>(NR, N - p * NR));
        switch (M) {
          case 1: tile(std::integral_constant<int, 1>{}, p, 1, cols); break;
          case 2: tile(std::integral_constant<int, 2>{}, p, 2, cols); break;
          case 3: tile(std::integral_constant<int, 3>{}, p, 3, cols); break;
          default: tile(std::integral_constant<int, 4>{}, p, int(M), cols); break;
        }
      }
    });
  };
#if defined(__AVX512BF16__) && KILN_VEC_BYTES == 64
  if (bf16_pairs) {
    const QuantPanels<4>& src4 = reinterpret_cast<const QuantPanels<4>&>(src);
    const SplitActivations act = split_activations(src.z, M, a, lda, sums);
    each_panel([&](auto R, int64_t p, int rows, int cols) {
      direct_tile_bf16<decltype(R)::value>(src4, p, rows, cols, act, sums, c, ldc, e);
    });
  } else
#endif
  each_panel([&](auto R, int64_t p, int rows, int cols) {
    direct_tile<BITS, decltype(R)::value>(src, p, rows, cols, a, lda, sums, c, ldc, e);
  });
  normalize_rows(M, N, c, ldc, e);
}

#ifdef KILN_GEMM_AMX
// Rows 2kp and 2kp + 1 of a panel's vector (`low`, `high`) as AMX reads them, in pairs of k at
// `out` (16 words: a column's two bfloat16 in each): rounded by vcvtne2ps2bf16 (to nearest even;
// it reads and makes subnormals as zeros, as TDPBF16PS reads them anyway), interleaved by one vpermw.
static inline void store_pairs(uint32_t* out, V low, V high) {
  const __m512i pairs_of = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                            22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh((__m512)high, (__m512)low);  // [low's 16 | high's 16]
  _mm512_store_si512(out, _mm512_permutexvar_epi16(pairs_of, both));
}

// This thread's buffer of at least `elements` E where it makes a panel (a panel's pair rows:
// uint32_t; its scales: float), 64-byte aligned (a tile row of B read across two lines took 2.3x
// the time), valid until the thread's next panel.
struct PanelBuffer;
template <typename E> static E* panel_buffer(int64_t elements) { return thread_buffer<PanelBuffer, E>(elements); }

// An int8 weight's panel as AMX's tiles read it (kiln_gemm_amx.h's PanelOf): its levels q
// (-127..127, exact in bfloat16) in pairs of k ([K/2][NR][2]; an odd K's last pair's high half 0)
// and its columns' scales, in this thread's buffers, valid until its next panel: the product is
// (A @ levels) * scales. `Parts`: A's bfloat16 parts (amx_padded_a): 3, A exactly, every product
// of a part and a level exact, so that only float32's summation and the scale's one rounding
// differ from eager's A @ (q * scale); 1, A rounded to bfloat16 (bfloat16 fast math).
template <int Parts> struct QuantLevelPanels {
  static constexpr bool made = true, scaled = true, whole_steps = false;
  static constexpr int parts = Parts, weight_parts = 1;
  QuantPanels<8> src;

  int64_t low_part() const { return 0; }

  const float* scales() const { return panel_buffer<float>(NR); }

  const kiln_bf16* operator()(int64_t p) const {
    const int64_t K = src.z.K, pairs = round_even(K) / 2;
    float* scale = panel_buffer<float>(NR);
    uint32_t* out = panel_buffer<uint32_t>(pairs * NR);
    for (int v = 0; v < NV; ++v) kiln::store(scale + v * L, src.scale(p, 0, v));
    const uint8_t* q = src.panel(p);
    for (int64_t kp = 0; kp < pairs; ++kp)  // (whole numbers of 8 bits: exact in bfloat16)
      for (int v = 0; v < NV; ++v)
        store_pairs(out + kp * NR + v * L, quant_lanes<8>(q, 2 * kp, v),
                    2 * kp + 1 < K ? quant_lanes<8>(q, 2 * kp + 1, v) : V{});
    return reinterpret_cast<const kiln_bf16*>(out);
  }
};

// w as store_pairs rounds it to bfloat16 (vcvtneps2bf16: subnormals to zero), widened back.
static inline V as_paired(V w) {
  return (V)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh((__m512)w)), 16);
}

// Panel p's int4 weights as QuantPanels::block makes them (eager's reference: (q - zero) * scale)
// as `pairs` pair rows at `high`, rounded to bfloat16, and, where `low`, the rounding of what each
// leaves (QuantSplitPanels); zeros past K.
// Groups of whole words take a word's 8 k from one load and their group's scales once: 896 x 9728
// at 5 rows, 2 threads of an Intel Xeon with AMX, one part 1.18 -> 0.53 ms, two 1.77 -> 1.10
// (a load and the group's check for every k and vector before).
static void make_pair_rows(const QuantPanels<4>& src, int64_t p, int64_t pairs, uint32_t* high, uint32_t* low) {
  const int64_t K = src.z.K;
  auto put = [&](int64_t kp, int v, V w0, V w1) {
    store_pairs(high + kp * NR + v * L, w0, w1);
    if (low) store_pairs(low + kp * NR + v * L, w0 - as_paired(w0), w1 - as_paired(w1));
  };
  int64_t k = 0;
  if (src.z.group % 8 == 0) {
    const uint8_t* q = src.panel(p);
    for (; k + 8 <= K; k += 8) {
      const int64_t g = k / src.z.group;
#pragma GCC unroll 3
      for (int v = 0; v < NV; ++v) {
        const V scale = src.scale(p, g, v), zero = src.zero(p, g, v);
        const kiln::vec<int32_t> word = load_words(q + ((k >> 3) * NR + v * L) * 4);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
          put(k / 2 + j, v, (nibble_lanes(word, 2 * j) - zero) * scale, (nibble_lanes(word, 2 * j + 1) - zero) * scale);
      }
    }
  }
  int64_t g = -1;  // (other groups, and a last partial word: a k at a time)
  V scale[NV], zero[NV];
  auto weights = [&](int64_t k, int v) {
    if (k / src.z.group != g) {
      g = k / src.z.group;
      for (int u = 0; u < NV; ++u) scale[u] = src.scale(p, g, u), zero[u] = src.zero(p, g, u);
    }
    return (quant_lanes<4>(src.panel(p), k, v) - zero[v]) * scale[v];
  };
  for (; k < 2 * pairs; k += 2)
    for (int v = 0; v < NV; ++v) put(k / 2, v, k < K ? weights(k, v) : V{}, k + 1 < K ? weights(k + 1, v) : V{});
}

// An int4 weight's panel as AMX's tiles read it in bfloat16 fast math: each weight dequantized as
// eager's reference makes it (QuantPanels::block's values), rounded to bfloat16 (store_pairs:
// 1.58 ms for 8.7 M weights on one thread where plain vector code took 2.11), into this thread's
// buffer, valid until its next panel. (int4's groups each have their scales: summing each group apart and scaling the sums,
// as QuantLevelPanels scales int8's once, stored and reloaded the tiles every 4 steps at groups of
// 128: 512x896x9728 10.7 ms against 5.3 with the weights dequantized.)
struct QuantPairPanels {
  static constexpr bool made = true, scaled = false, whole_steps = false;
  static constexpr int parts = 1, weight_parts = 1;
  QuantPanels<4> src;

  int64_t low_part() const { return 0; }
  const float* scales() const { return nullptr; }
  const kiln_bf16* operator()(int64_t p) const {
    const int64_t pairs = round_even(src.z.K) / 2;
    uint32_t* out = panel_buffer<uint32_t>(pairs * NR);
    make_pair_rows(src, p, pairs, out, nullptr);
    return reinterpret_cast<const kiln_bf16*>(out);
  }
};

// An int4 weight's panel as AMX's tiles read it by default (float32 math): each weight w
// dequantized as eager's reference makes it, in two bfloat16 parts, w's rounding and the rounding
// of what is left (w to 16 significant bits: within 2^-17 |w|), and A in two parts too
// (amx_padded_a, within 2^-17 |a|); each step sums a1 w1 + a2 w1 + a1 w2, the part left out, a2
// w2, under 2^-16 |a w|. Each product of a row and a column then lies within ~2^-15.4 sum |a w| of
// eager's A @ w beside float32's own summation error (up to K 2^-24 sum |a w|): decode's digits
// hold an activation to 2^-13.9 of its group's largest. A group's scales cannot wait for the sums
// here as int8's one scale does (QuantLevelPanels): summed apart, each group's tiles were stored
// and reloaded every 4 steps (QuantPairPanels). Both parts in this thread's buffer, valid until its
// next panel, their pair rows to whole steps (zeros past K).
struct QuantSplitPanels {
  static constexpr bool made = true, scaled = false, whole_steps = true;
  static constexpr int parts = 2, weight_parts = 2;
  QuantPanels<4> src;

  int64_t pair_rows() const { return (src.z.K + AMX_K - 1) / AMX_K * (AMX_K / 2); }
  int64_t low_part() const { return pair_rows() * NR * 2; }
  const float* scales() const { return nullptr; }
  const kiln_bf16* operator()(int64_t p) const {
    const int64_t pairs = pair_rows();
    uint32_t* high = panel_buffer<uint32_t>(2 * pairs * NR);
    make_pair_rows(src, p, pairs, high, high + pairs * NR);
    return reinterpret_cast<const kiln_bf16*>(high);
  }
};
#endif

// Whether a product of M rows runs on AMX's tiles: a prompt's rows, AMX this CPU's bfloat16 product
// (kiln_gemm.h `bf16_product`). In bfloat16 fast math (`bf16_math`: QuantLevelPanels<1>,
// QuantPairPanels) more than DIRECT_ROWS; by default int8 (QuantLevelPanels<3>: A in three parts)
// from 16 rows and int4 (QuantSplitPanels: three products a step, two parts of each weight made)
// from 32, where the tiles overtake the float32 GEMM, whose blocks make no panel per call. 2
// threads of an Intel Xeon with AMX, 896 x 9728 (4864 x 896, 896 x 1152), the float32 GEMM's time
// over AMX's: int8 at 8 rows 1.00x (0.96x, 0.81x), 16 1.94x (1.86x, 1.12x); int4 at 16 rows 1.17x
// (1.11x, 0.81x), 32 1.25x (1.22x, 1.00x), 64 1.53x (1.63x, 1.28x). A decode step's few rows keep
// the products above: they read 4 or 8 bits a weight at about the memory's speed.
constexpr int64_t AMX_INT8_ROWS = 16, AMX_INT4_ROWS = 32;
static inline bool quant_amx_applies(const QuantShape& z, int64_t M, bool bf16_math) {
#ifdef KILN_GEMM_AMX
  const int64_t least = bf16_math ? DIRECT_ROWS + 1 : z.bits == 8 ? AMX_INT8_ROWS : AMX_INT4_ROWS;
  return M >= least && bf16_product() == BF16_AMX && amx_usable();
#else
  (void)z, (void)M, (void)bf16_math;
  return false;
#endif
}

// C [M, N] = epilogue(A @ B), B packed by pack_quant, on AMX's tiles (quant_amx_applies): int8's
// levels with a float32 A in three parts (exactly) or, in bfloat16 fast math and for a bfloat16
// A, one; int4's weights dequantized and rounded to bfloat16 (fast math, bfloat16 A), or by
// default in two parts with a float32 A in two (QuantSplitPanels).
template <typename T>
static void gemm_quant_amx(const QuantShape& z, int64_t M, const T* a, int64_t lda, const uint8_t* packed, void* c,
                           int64_t ldc, const Epilogue* e, bool bf16_math) {
#ifdef KILN_GEMM_AMX
  if constexpr (std::is_same_v<T, float>)  // (a bfloat16 A comes in fast math: its weights rounded as eager's)
    if (z.bits == 4 && !bf16_math) return amx_product(M, z.N, z.K, a, lda, QuantSplitPanels{{z, packed}}, c, ldc, e);
  if (z.bits == 4) return amx_product(M, z.N, z.K, a, lda, QuantPairPanels{{z, packed}}, c, ldc, e);
  if (bf16_math) return amx_product(M, z.N, z.K, a, lda, QuantLevelPanels<1>{{z, packed}}, c, ldc, e);
  amx_product(M, z.N, z.K, a, lda, QuantLevelPanels<3>{{z, packed}}, c, ldc, e);
#else
  (void)z, (void)M, (void)a, (void)lda, (void)packed, (void)c, (void)ldc, (void)e, (void)bf16_math;
#endif
}

// The path a product of M rows over this weight takes: more than DIRECT_ROWS, AMX's tiles where they
// apply (PATH_AMX: int8), else the float32 GEMM; fewer: at AMX_FEW_ROWS AMX's integer tiles where
// the CPU has them (amx_digits_products, PATH_AMX: int8, int4 in groups of whole chunks), else
// int8: the digits where dot4 is
// one instruction: 64 weights a dot product per digit where the float32 path takes four
// instructions per 16 (two shifts, a conversion, an FMA), which bound it below a fast memory's
// speed (768 x 2048 from L2, 2 threads of a 2-core AMD EPYC, Zen 4, C kernels over this layout: the
// float32 path 52 GB/s, three digits 120-128; kiln's, a llama-160m layer's products from L3 through
// ctypes, 1 to 4 rows: 0.45/0.45/0.53/0.67 ms against 0.23/0.32/0.48/0.57). AVX2's dot4 takes three
// instructions and its 16 registers hold fewer sums: built for x86-64-v3 and run on that Zen 4, the
// digits win at one row (0.31 ms; the float32 path 0.43, the bytes widened before the quads 0.32)
// and lose at two to four (0.53/0.79/1.01 against 0.45/0.61/0.64), so there one row only. int4:
// the fastest it measured.
static inline int quant_path_for(const QuantShape& z, int64_t M) {
  if (M > DIRECT_ROWS) return quant_amx_applies(z, M, false) ? PATH_AMX : PATH_FLOAT32;
#ifdef KILN_QUANT_AMX_FEW
  if (M >= AMX_FEW_ROWS && amx_few_rows_apply(z, M)) return PATH_AMX;
#endif
  if (z.bits == 8)
    return quant_path_applies(z, PATH_INT8_DIGITS) && (DOT4_ONE_INSTRUCTION || M == 1) ? PATH_INT8_DIGITS : PATH_FLOAT32;
  const int fastest = int4_fastest_path(M == 1 ? 1 : 4);
  return quant_path_applies(z, fastest) ? fastest : PATH_FLOAT32;
}

// C [M, N] = epilogue(A [M, K] (float32, row stride lda) @ B), B packed by pack_quant.
static void gemm_quant(const QuantShape& z, int64_t M, const float* a, int64_t lda, const uint8_t* packed, void* c,
                       int64_t ldc, const Epilogue* e, int64_t kc) {
  if (gated(e) && M > DIRECT_ROWS)  // (fewer: gemm_quant_direct decides)
    return gated_apart(z, M, c, ldc, *e, [&](float* sums, int64_t ld) { gemm_quant(z, M, a, lda, packed, sums, ld, nullptr, kc); });
  if (quant_amx_applies(z, M, false)) return gemm_quant_amx(z, M, a, lda, packed, c, ldc, e, false);
  if (z.bits == 8) {
    if (M <= DIRECT_ROWS) return gemm_quant_direct(QuantPanels<8>{z, packed}, M, a, lda, c, ldc, e, quant_path_for(z, M));
    return gemm_from(M, z.N, z.K, a, lda, QuantPanels<8>{z, packed}, c, ldc, e, kc);
  }
  if (M <= DIRECT_ROWS)
    return gemm_quant_direct(QuantPanels<4>{z, packed}, M, a, lda, c, ldc, e, quant_path_for(z, M));
  gemm_from(M, z.N, z.K, a, lda, QuantPanels<4>{z, packed}, c, ldc, e, kc);
}

// C [M, N] = epilogue(A @ B), B packed by pack_quant, in bfloat16 fast math (backend.fp32_gemm =
// bf16: kiln::mm_quant's impl "kiln_bf16"): a prompt's rows on AMX's tiles where they apply (A
// rounded to bfloat16; int8's levels exact, int4's weights rounded to bfloat16: the dense fast
// math's error on top of the quantization's); elsewhere gemm_quant's products.
static void gemm_quant_bf16_math(const QuantShape& z, int64_t M, const float* a, int64_t lda, const uint8_t* packed,
                                 void* c, int64_t ldc, const Epilogue* e, int64_t kc) {
  if (gated(e) && quant_amx_applies(z, M, true))
    return gated_apart(z, M, c, ldc, *e, [&](float* sums, int64_t ld) { gemm_quant_amx(z, M, a, lda, packed, sums, ld, nullptr, true); });
  if (quant_amx_applies(z, M, true)) return gemm_quant_amx(z, M, a, lda, packed, c, ldc, e, true);
  gemm_quant(z, M, a, lda, packed, c, ldc, e, kc);
}

// C [M, N] = epilogue(A @ B) of a bfloat16 A (a bfloat16 model's quantized layers; C bfloat16
// where the epilogue says out_bf16): a prompt's rows on AMX's tiles where they apply, A read as
// it is (int8's levels exact; int4's weights rounded to bfloat16, as eager's reference rounds
// them: weight.to(x.dtype)); elsewhere A widened to float32 (exact) for gemm_quant's products.
static void gemm_quant_bf16_rows(const QuantShape& z, int64_t M, const kiln_bf16* a, int64_t lda, const uint8_t* packed,
                                 void* c, int64_t ldc, const Epilogue* e, int64_t kc) {
  if (gated(e) && quant_amx_applies(z, M, true))
    return gated_apart(z, M, c, ldc, *e, [&](float* sums, int64_t ld) { gemm_quant_amx(z, M, a, lda, packed, sums, ld, nullptr, true); });
  if (quant_amx_applies(z, M, true)) return gemm_quant_amx(z, M, a, lda, packed, c, ldc, e, true);
  const std::unique_ptr<float[]> wide = widened_rows(M, z.K, a, lda);
  gemm_quant(z, M, wide.get(), z.K, packed, c, ldc, e, kc);
}

// C [M, N] = epilogue(A' @ B), A' = A's rows quantized to int8 per group (int8 activations, above),
// B int4 packed by pack_quant. `integer`: the vpdpbusd path where it applies; else (and where it
// does not) the float32 GEMM over A' (the same product: tests run both).
static void gemm_quant_int8_activations(const QuantShape& z, int64_t M, const float* a, int64_t lda,
                                        const uint8_t* packed, void* c, int64_t ldc, const Epilogue* e, int64_t kc,
                                        bool integer) {
#if KILN_INT8_DOT
  if (integer && int8_dot_applies(z, M) && gated(e) && M > 1)
    return gated_apart(z, M, c, ldc, *e, [&](float* sums, int64_t ld) {
      gemm_quant_int8_activations(z, M, a, lda, packed, sums, ld, nullptr, kc, integer);
    });
  if (integer && int8_dot_applies(z, M))
    return int8_products<4, 1>(QuantPanels<4>{z, packed}, M, [&] { return split_rows(z, M, a, lda, 1); }, c, ldc, e);
#endif
  (void)integer;
  const Int8Rows x = split_rows(z, M, a, lda, 1, false);
  std::unique_ptr<float[]> rows(new float[M * z.K]);
#pragma omp parallel for if (M * z.K >= (int64_t(1) << 16)) num_threads(kiln::team())
  for (int64_t r = 0; r < M; ++r)
    for (int64_t g = 0; g < x.groups; ++g) {
      const float scale = 16.0f * x.unit[r * x.groups + g];  // (the levels times their scale, as eager's)
      for (int64_t k = g * z.group; k < std::min(z.K, (g + 1) * z.group); ++k)
        rows[r * z.K + k] = float(x.q[r * x.stride + k]) * scale;
    }
  gemm_quant(z, M, rows.get(), z.K, packed, c, ldc, e, kc);
}

// (benchmarks) A decode step's products in one call, as kiln's C++ wrapper runs them, not one
// ctypes call each (~8 us of Python: 0.8 ms of a Qwen2-0.5B step's 97): product i is
// gemm_quant at `rows` rows of a[i] with weight packed[i] (`bits`, K[i], N[i], group[i]; bits 32:
// float32's gemm over pack_b's panels), no epilogue, into c[i]; ns[i] += its nanoseconds.
// benchmarks/tools/quant_decode_sweep.py --in-c.
static void quant_step(int32_t count, int bits, int64_t rows, const int64_t* N, const int64_t* K, const int64_t* group,
                       const float* const* a, const uint8_t* const* packed, float* const* c, int64_t kc, double* ns) {
  for (int32_t i = 0; i < count; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (bits == 32)
      gemm(rows, N[i], K[i], a[i], K[i], reinterpret_cast<const float*>(packed[i]), c[i], N[i], nullptr, kc);
    else
      gemm_quant(QuantShape{bits, K[i], N[i], group[i]}, rows, a[i], K[i], packed[i], c[i], N[i], nullptr, kc);
    ns[i] += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  }
}

// (benchmarks) The floor a step's products are held to: every line of `count` pieces of memory
// read in one call, a piece at a time as the products take them (one parallel region each), each
// thread's share in `runs` runs read side by side, each line also asked for `ahead` bytes ahead
// (prefetcht1; 0: none). One load a line: the memory's speed, not a reduction's. On the Intel
// Xeon of RUNS_PREFETCH_UNITS, Qwen2-0.5B's int4 packs from DRAM (2 MB pages, 2 threads) read
// fastest in 2-4 runs with 3 KB ahead: 41 GB/s (one run, nothing ahead: 32; 2-4 runs, nothing
// ahead: 36) and the kernel 34 (8.25 ms against 6.8), the packs cycled through copies of them (the
// VM's 480 MB L3 may keep some); over the llm probe's 1 GiB buffer (2 runs, 3 KB ahead: one of its
// reads, benchmarks/roofline.py) 36.7 where ATen's best read 33.2-33.5. `ns` (or null): each
// piece's nanoseconds added, as quant_step adds each product's.
static std::atomic<uint64_t> read_pieces_kept{0};  // (so that the reads are not optimized away)
static void read_pieces(int32_t count, const uint8_t* const* pieces, const int64_t* bytes, int runs, int64_t ahead,
                        double* ns = nullptr) {
  for (int32_t i = 0; i < count; ++i) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t kept = 0;
#pragma omp parallel reduction(^ : kept)
    {
      int64_t lo, hi;
      range(bytes[i] / 64, omp_get_num_threads(), omp_get_thread_num(), lo, hi);
      const int64_t per = (hi - lo) / runs;
      const uint8_t* at = pieces[i] + lo * 64;
      for (int64_t line = 0; line < per; ++line)
        for (int r = 0; r < runs; ++r) {
          const uint8_t* p = at + (r * per + line) * 64;
          if (ahead) __builtin_prefetch(p + ahead, 0, 2);
          uint64_t word;
          std::memcpy(&word, p, sizeof word);
          kept ^= word;
        }
      for (int64_t line = runs * per; line < hi - lo; ++line) {  // the lines past whole runs
        uint64_t word;
        std::memcpy(&word, at + line * 64, sizeof word);
        kept ^= word;
      }
    }
    read_pieces_kept ^= kept;
    if (ns) ns[i] += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  }
}

}  // namespace kiln_gemm
