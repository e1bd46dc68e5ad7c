// kiln's depthwise convolution on CPU, float32, channels-last: y[n, oh, ow, c] =
// epilogue(bias[c] + sum over kh, kw of x[n, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw, c] * w[c, kh, kw]),
// the epilogue adding `other` (same layout) and then a unary op, as kiln::conv's other
// implementations do.
//
// Vectors run along the channels (contiguous in channels-last memory), the weight packed once as
// [KH * KW][C] so each tap's weights are one vector load. Square 3 x 3 (stride 1 or 2), 5 x 5 and
// 7 x 7 (stride 1) kernels run blocks of two output rows (rows_block; threads take (image, row
// pair) pairs); other kernels, and the channels' partial last vector, a block of up to OWB output
// pixels of one row (block, block_unit_stride; threads take (image, output row) pairs). Either
// way one accumulator a pixel, in registers, and blocks whose every tap lies inside the input run
// without bounds checks. The autotuner times it against oneDNN's and ATen's convolutions per shape
// (docs/freezing.md).
#pragma once
#include <algorithm>
#include <cstdint>
#include <omp.h>

namespace kiln_depthwise {
using kiln_gemm::V;
using kiln::L;

constexpr int OWB = 8;  // output pixels per block at most: 8 accumulators, their inputs, the weights

struct Shape {
  int64_t N, H, W, C, KH, KW, OH, OW;
  int64_t sh, sw, ph, pw, dh, dw;
};

// w [C, 1, KH, KW] (contiguous) as [KH * KW][C].
static inline void pack_weight(const float* w, int64_t C, int64_t taps, float* out) {
  for (int64_t t = 0; t < taps; ++t)
    for (int64_t c = 0; c < C; ++c) out[t * C + c] = w[c * taps + t];
}

// OB output pixels from ow on, channels c0 .. c0 + cn, into out: OB is a constant, so the
// accumulators live in registers.
template <int OB, bool Checked>
static inline void block(const Shape& s, const float* xn, const float* wp, const float* bias, int64_t oh, int64_t ow,
                         int64_t c0, int cn, V* out) {
  V acc[OB];
  const V b = bias ? kiln_gemm::load_n(bias + c0, false, cn) : V{};
#pragma GCC unroll 16
  for (int o = 0; o < OB; ++o) acc[o] = b;
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
    if (ih < 0 || ih >= s.H) continue;
    const float* xr = xn + ih * s.W * s.C + c0;
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      const V wv = kiln_gemm::load_n(wp + (kh * s.KW + kw) * s.C + c0, false, cn);
      const float* xk = xr + (ow * s.sw - s.pw + kw * s.dw) * s.C;
#pragma GCC unroll 16
      for (int o = 0; o < OB; ++o) {
        if constexpr (Checked) {
          const int64_t iw = (ow + o) * s.sw - s.pw + kw * s.dw;
          if (iw < 0 || iw >= s.W) continue;
        }
        acc[o] = kiln_gemm::fma(kiln_gemm::load_n(xk + o * s.sw * s.C, false, cn), wv, acc[o]);
      }
    }
  }
#pragma GCC unroll 16
  for (int o = 0; o < OB; ++o) out[o] = acc[o];
}

// A block for stride 1, dilation 1 and a KW known at compile time: each input vector of a row is
// loaded once and multiplied into every accumulator whose taps reach it (OB + KW - 1 loads a row
// instead of OB * KW; ConvNeXt's 7 x 7: 14 against 56). Checked: columns outside the input read
// as the zero padding.
template <int OB, int KW, bool Checked>
static inline void block_unit_stride(const Shape& s, const float* xn, const float* wp, const float* bias, int64_t oh,
                                     int64_t ow, int64_t c0, int cn, V* out) {
  V acc[OB];
  const V b = bias ? kiln_gemm::load_n(bias + c0, false, cn) : V{};
#pragma GCC unroll 16
  for (int o = 0; o < OB; ++o) acc[o] = b;
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    const int64_t ih = oh - s.ph + kh;
    if (ih < 0 || ih >= s.H) continue;
    const float* xr = xn + ih * s.W * s.C + (ow - s.pw) * s.C + c0;
    V w[KW];
#pragma GCC unroll 16
    for (int kw = 0; kw < KW; ++kw) w[kw] = kiln_gemm::load_n(wp + (kh * KW + kw) * s.C + c0, false, cn);
#pragma GCC unroll 32
    for (int j = 0; j < OB + KW - 1; ++j) {
      V xv = V{};  // a column of the zero padding, where checked
      if (!Checked || (ow - s.pw + j >= 0 && ow - s.pw + j < s.W)) xv = kiln_gemm::load_n(xr + j * s.C, false, cn);
#pragma GCC unroll 16
      for (int kw = 0; kw < KW; ++kw) {
        const int o = j - kw;
        if (o >= 0 && o < OB) acc[o] = kiln_gemm::fma(xv, w[kw], acc[o]);
      }
    }
  }
#pragma GCC unroll 16
  for (int o = 0; o < OB; ++o) out[o] = acc[o];
}

// Blocks of 8, 4, 2 and 1 pixels (a row's tail in the largest that fit), checked or not, for one
// kernel width's unit-stride form (KW > 0) or the general one (KW = 0).
using Block = void (*)(const Shape&, const float*, const float*, const float*, int64_t, int64_t, int64_t, int, V*);
template <int KW, bool Checked, int OB>
static void any_block(const Shape& s, const float* xn, const float* wp, const float* bias, int64_t oh, int64_t ow,
                      int64_t c0, int cn, V* out) {
  if constexpr (KW > 0) block_unit_stride<OB, KW, Checked>(s, xn, wp, bias, oh, ow, c0, cn, out);
  else block<OB, Checked>(s, xn, wp, bias, oh, ow, c0, cn, out);
}
struct Blocks { Block by_size[2][4]; };  // [checked][8, 4, 2, 1 pixels]
template <int KW>
static constexpr Blocks blocks_for() {
  return {{{any_block<KW, false, 8>, any_block<KW, false, 4>, any_block<KW, false, 2>, any_block<KW, false, 1>},
           {any_block<KW, true, 8>, any_block<KW, true, 4>, any_block<KW, true, 2>, any_block<KW, true, 1>}}};
}
static inline Blocks blocks_for(const Shape& s) {
  if (s.sw == 1 && s.dw == 1 && s.dh == 1) {
    if (s.KW == 3) return blocks_for<3>();
    if (s.KW == 5) return blocks_for<5>();
    if (s.KW == 7) return blocks_for<7>();
  }
  return blocks_for<0>();
}

// K x K kernels of stride S, dilation 1 (3 x 3 of stride 1 or 2, the depthwise convolutions of
// MobileNets; 5 x 5 and ConvNeXt's 7 x 7 of stride 1): R output rows of OB pixels at once. Each
// input row is loaded once for every output row it reaches (R = 2, 3 x 3: 2.5 loads an output
// vector at stride 1, against 3.75 a row at a time),
// and the R * OB accumulators are that many independent FMA chains: a row at a time, eight
// chains of nine dependent FMAs left the FMA units idle most of the time (3x slower at 16
// channels, where everything is in L1). Checked: columns outside the input read as zeros; input
// rows outside it are skipped.
#if KILN_VEC_BYTES == 64 || defined(__aarch64__)
constexpr int ROWS = 2;  // 32 vector registers: 3 x 3: 16 accumulators, 6 weights, the input vector
#else
constexpr int ROWS = 1;  // 16 registers: 3 x 3: 8 accumulators, 3 weights, the input vector
#endif

template <int R, int OB, int S, int K, bool Checked>
static void rows_block(const Shape& s, const float* xn, const float* wp, const float* bias, int64_t oh, int64_t ow,
                       int64_t c0, int rows, const float* other, float* y, const kiln_gemm::Epilogue& e) {
  V acc[R][OB];
  const V b = bias ? kiln::load(bias + c0) : V{};
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int o = 0; o < OB; ++o) acc[r][o] = b;
  const int64_t col = ow * S - s.pw;  // the block's first input column
#pragma GCC unroll 8
  for (int ir = 0; ir < S * (R - 1) + K; ++ir) {
    const int64_t ih = oh * S - s.ph + ir;
    if (ih < 0 || ih >= s.H) continue;
    const float* xr = xn + (ih * s.W + col) * s.C + c0;
    V w[R][K];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int kh = ir - S * r;
      if (kh < 0 || kh >= K) continue;
#pragma GCC unroll 7
      for (int kw = 0; kw < K; ++kw) w[r][kw] = kiln::load(wp + (kh * K + kw) * s.C + c0);
    }
#pragma GCC unroll 32
    for (int j = 0; j < S * (OB - 1) + K; ++j) {
      V xv = V{};
      if (!Checked || (col + j >= 0 && col + j < s.W)) xv = kiln::load(xr + j * s.C);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int kh = ir - S * r;
        if (kh < 0 || kh >= K) continue;
#pragma GCC unroll 7
        for (int kw = 0; kw < K; ++kw) {
          const int o = (j - kw) / S;
          if (j >= kw && (j - kw) % S == 0 && o < OB) acc[r][o] = kiln_gemm::fma(xv, w[r][kw], acc[r][o]);
        }
      }
    }
  }
  // The epilogue: + other stored, then the unary op in place over each row (called per vector
  // here, it was a call with a switch each, even for none: ReLU6 now 0.78-0.83x that time, no op
  // 0.76x); a block of the image's last rows (rows < R) stores only those.
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    float* yr = y + ((oh + r) * s.OW + ow) * s.C + c0;
    const float* otherr = other ? other + ((oh + r) * s.OW + ow) * s.C + c0 : nullptr;
#pragma GCC unroll 16
    for (int o = 0; o < OB; ++o) {
      V v = acc[r][o];
      if (otherr) v += kiln::load(otherr + o * s.C);
      kiln::store(yr + o * s.C, v);
    }
    if (e.unary) kiln_gemm::unary_in_place(yr, s.C, OB, e);
  }
}

// Whole channel vectors: blocks of [W, W/2, W/4, 1] pixels, [unchecked, checked] (checked: some
// column reaches into the padding).
using RowsBlock = void (*)(const Shape&, const float*, const float*, const float*, int64_t, int64_t, int64_t, int,
                           const float*, float*, const kiln_gemm::Epilogue&);
struct RowsBlocks { int widest; RowsBlock by[2][4]; };
template <int S, int K, int W, bool Checked>
static constexpr void rows_blocks_into(RowsBlock (&by)[4]) {
  by[0] = rows_block<ROWS, W, S, K, Checked>, by[1] = rows_block<ROWS, W / 2, S, K, Checked>;
  by[2] = rows_block<ROWS, W / 4, S, K, Checked>, by[3] = rows_block<ROWS, 1, S, K, Checked>;
}
template <int S, int K, int W>
static constexpr RowsBlocks rows_blocks_for() {
  RowsBlocks b{W, {}};
  rows_blocks_into<S, K, W, false>(b.by[0]), rows_blocks_into<S, K, W, true>(b.by[1]);
  return b;
}
// Blocks for s's kernel, or null: 3 x 3 of stride 1 or 2, 5 x 5 and 7 x 7 of stride 1, dilation 1.
static inline const RowsBlocks* rows_blocks(const Shape& s) {
  static constexpr RowsBlocks k3s1 = rows_blocks_for<1, 3, 8>(), k3s2 = rows_blocks_for<2, 3, 8>(),
                              k5s1 = rows_blocks_for<1, 5, 8>(), k7s1 = rows_blocks_for<1, 7, 8>();
  if (s.KH != s.KW || s.dh != 1 || s.dw != 1 || s.sh != s.sw) return nullptr;
  if (s.KH == 3) return s.sh == 1 ? &k3s1 : s.sh == 2 ? &k3s2 : nullptr;
  if (s.sh != 1) return nullptr;
  return s.KH == 5 ? &k5s1 : s.KH == 7 ? &k7s1 : nullptr;
}

// Output columns [first, last) whose taps all lie inside the input row (no bounds checks).
static inline void unchecked_columns(const Shape& s, int64_t& first, int64_t& last) {
  first = std::min<int64_t>(s.OW, (s.pw + s.sw - 1) / s.sw);
  const int64_t reach = s.W - 1 - (s.KW - 1) * s.dw + s.pw;  // the last column's start, at most
  last = std::max<int64_t>(first, reach < 0 ? 0 : std::min<int64_t>(s.OW, reach / s.sw + 1));
}

// The epilogue of one block's accumulators: + other, the unary op, stored.
static inline void store_block(const Shape& s, const V* acc, int ob, int64_t at, int cn, const float* other, float* y,
                               const kiln_gemm::Epilogue& e) {
  for (int o = 0; o < ob; ++o, at += s.C) {
    V v = acc[o];
    if (other) v += kiln_gemm::load_n(other + at, false, cn);
    kiln_gemm::store_n(y + at, false, kiln_gemm::unary(v, e), cn);
  }
}

static void conv_rows(const Shape& s, const RowsBlocks& blocks, const float* x, const float* wp, const float* bias,
                      const float* other, float* y, const kiln_gemm::Epilogue& e) {
  const Blocks tail_blocks = blocks_for(s);  // the channels' last, partial vector: a row at a time
  int64_t first, last;
  unchecked_columns(s, first, last);
  const int64_t row_blocks = (s.OH + ROWS - 1) / ROWS, whole = s.C / L * L;
#pragma omp parallel for collapse(2) schedule(static) num_threads(kiln::team())
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
      const int64_t image = n * s.H * s.W * s.C, image_out = n * s.OH * s.OW * s.C, oh = rb * ROWS;
      const int rows = int(std::min<int64_t>(ROWS, s.OH - oh));
      const float* other_n = other ? other + image_out : nullptr;
      for (int64_t ow = 0; ow < s.OW;) {
        // Unchecked blocks inside [first, last); a checked block from a column before `first`
        // reaches as far as the row allows (at 14 x 14 with a 7 x 7 kernel: 8 pixels from 0).
        const bool checked = !(ow >= first && ow < last);
        const int64_t left = (checked ? s.OW : last) - ow, w = blocks.widest;
        const int size = left >= w ? 0 : left >= w / 2 ? 1 : left >= w / 4 ? 2 : 3;
        const RowsBlock run = blocks.by[checked][size];
        const int ob = size == 3 ? 1 : int(w >> size);
        for (int64_t c0 = 0; c0 < whole; c0 += L) run(s, x + image, wp, bias, oh, ow, c0, rows, other_n, y + image_out, e);
        ow += ob;
      }
      if (whole == s.C) continue;
      V acc[OWB];
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t ow = 0; ow < s.OW;) {
          const int64_t left = s.OW - ow;
          const int size = left >= 8 ? 0 : left >= 4 ? 1 : left >= 2 ? 2 : 3, ob = 8 >> size;
          const bool checked = !(ow >= first && ow + ob <= last);
          tail_blocks.by_size[checked][size](s, x + image, wp, bias, oh + r, ow, whole, int(s.C - whole), acc);
          store_block(s, acc, ob, image_out + ((oh + r) * s.OW + ow) * s.C + whole, int(s.C - whole), other, y, e);
          ow += ob;
        }
      }
    }
  }
}

// x, other and y channels-last contiguous; wp from pack_weight; e: the unary op (its bias and
// residual fields unused: bias and other are passed here).
static void conv(const Shape& s, const float* x, const float* wp, const float* bias, const float* other, float* y,
                 const kiln_gemm::Epilogue& e) {
  if (const RowsBlocks* rows = rows_blocks(s)) return conv_rows(s, *rows, x, wp, bias, other, y, e);
  int64_t first, last;
  unchecked_columns(s, first, last);
  const Blocks blocks = blocks_for(s);
#pragma omp parallel for collapse(2) schedule(static) num_threads(kiln::team())
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      const float* xn = x + n * s.H * s.W * s.C;
      const int64_t row = (n * s.OH + oh) * s.OW * s.C;
      V acc[OWB];
      for (int64_t c0 = 0; c0 < s.C; c0 += L) {
        const int cn = int(std::min<int64_t>(L, s.C - c0));
        for (int64_t ow = 0; ow < s.OW;) {
          const int64_t left = s.OW - ow;
          const int size = left >= 8 ? 0 : left >= 4 ? 1 : left >= 2 ? 2 : 3, ob = 8 >> size;
          const bool checked = !(ow >= first && ow + ob <= last);
          blocks.by_size[checked][size](s, xn, wp, bias, oh, ow, c0, cn, acc);
          store_block(s, acc, ob, row + ow * s.C + c0, cn, other, y, e);
          ow += ob;
        }
      }
    }
  }
}

}  // namespace kiln_depthwise
