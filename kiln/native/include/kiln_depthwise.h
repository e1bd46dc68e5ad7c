// kiln's depthwise convolution on CPU, float32, channels-last: y[n, oh, ow, c] =
// epilogue(bias[c] + sum over kh, kw of x[n, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw, c] * w[c, kh, kw]),
// the epilogue adding `other` (same layout) and then a unary op, as kiln::conv's other
// implementations do.
//
// Vectors run along the channels (contiguous in channels-last memory), the weight packed once as
// [KH * KW][C] so each tap's weights are one vector load. A block of up to OWB output pixels of one
// row shares each tap's weight vector (one accumulator a pixel, in registers); blocks whose every
// tap lies inside the input run without bounds checks. Threads take (image, output row) pairs.
// The autotuner times it against oneDNN's and ATen's convolutions per shape (docs/freezing.md):
// it wins where oneDNN's per-call work is a large share (small images, many channels) and on
// ConvNeXt's 7 x 7 kernels, and loses on some large images with few channels.
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

// x, other and y channels-last contiguous; wp from pack_weight; e: the unary op (its bias and
// residual fields unused: bias and other are passed here).
static void conv(const Shape& s, const float* x, const float* wp, const float* bias, const float* other, float* y,
                 const kiln_gemm::Epilogue& e) {
  // Output columns whose taps all lie inside the input row (no bounds checks).
  const int64_t first = std::min<int64_t>(s.OW, (s.pw + s.sw - 1) / s.sw);
  const int64_t reach = s.W - 1 - (s.KW - 1) * s.dw + s.pw;  // the last column's start, at most
  const int64_t last = std::max<int64_t>(first, reach < 0 ? 0 : std::min<int64_t>(s.OW, reach / s.sw + 1));
  const Blocks blocks = blocks_for(s);
#pragma omp parallel for collapse(2) schedule(static)
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
          for (int o = 0; o < ob; ++o) {
            const int64_t at = row + (ow + o) * s.C + c0;
            V v = acc[o];
            if (other) v += kiln_gemm::load_n(other + at, false, cn);
            kiln_gemm::store_n(y + at, false, kiln_gemm::unary(v, e), cn);
          }
          ow += ob;
        }
      }
    }
  }
}

}  // namespace kiln_depthwise
