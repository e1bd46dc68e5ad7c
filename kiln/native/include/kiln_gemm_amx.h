// kiln's GEMM on Intel AMX's tiles: bfloat16 products of 2 rows and more (kiln_gemm.h's BF16_AMX).
//
// An AMX unit multiplies whole tiles: TDPBF16PS adds to a 16 x 16 float32 tile of C the products
// of a 16 x 32 bfloat16 tile of A and a 32 x 16 one of B held as 16 rows of k pairs — 16 x 16 x 32
// multiply-adds in one instruction, about eight times what vdpbf16ps makes in the same cycles. B's
// tile is exactly a slice of kiln's pair panels ([K/2][NR][2], kiln_gemm.h `pack_b`): 16 pair rows
// of 16 columns, rows NR pairs apart, so the panels packed once for vdpbf16ps are read as they are.
//
// A block of C is 32 rows of a panel's 48 columns: six C tiles (tmm0-5) in the tile registers for
// the whole K, started from the bias, one tile for A (tmm6) and one for B (tmm7). Each step of 32
// k loads A's upper half, B's first slice, A's lower half, B's second, A's upper half, B's third
// (seven loads for six products, from L1 and L2), then the block goes to C: stored straight from
// the tiles where it is whole and float32 (the rest of the epilogue after, in place), a whole
// block of a bfloat16 C through the thread's buffer (the epilogue there, each row rounded into
// C), a ragged one through kiln_gemm.h's `store_block`. K is not cut in blocks (partial sums
// would go through C): a block's A rows (32 x K bfloat16) and the panel (K x 48) stay in L2 up
// to K ~ 8192. The rows go in passes of about 1 MB of A over the thread's panels, as the vector
// tiles' do.
//
// Where K is not a multiple of 32 or M of 32, A is copied once into a zero-padded buffer (every
// thread reads all of A), and each panel's last step of pairs into a zero-padded slice: a tile
// never reads past its operand, and the padding adds zeros.
//
// Linux hands a process AMX's tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM, as
// oneDNN asks the first time it runs AMX): asked once, the first time this path is considered;
// where the kernel refuses, the path is not offered (kiln_gemm.h `bf16_fastest_product`).
#pragma once
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && KILN_VEC_BYTES == 64
#include <sys/syscall.h>
#include <unistd.h>

namespace kiln_gemm {

static_assert(NR == 48, "an AMX block is 3 tiles of 16 columns: a panel of 48");
constexpr int AMX_ROWS = 32, AMX_K = 32;  // C rows a block; k a step
#ifndef KILN_GEMM_AMX_AHEAD  // to time another distance (0: none)
#define KILN_GEMM_AMX_AHEAD 4
#endif
#ifndef KILN_GEMM_AMX_PASS_KB  // to time other passes over the panels (0: every block in one)
#define KILN_GEMM_AMX_PASS_KB 1024
#endif

static bool amx_usable() {
  static const bool usable = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return usable;
}

// LDTILECFG's operand (palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxConfig() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = 16;
  }
};

// One step of 32 k into the block's six C tiles: A's rows at a (lda bytes apart; the lower half
// 16 rows further), the panel's pair rows at b (NR pairs apart). `two`: the lower half is rows.
static inline void amx_step(const kiln_bf16* a, int64_t lda_bytes, const kiln_bf16* b, bool two) {
  constexpr int64_t B_STRIDE = NR * 2 * sizeof(kiln_bf16);
  const char* lower = reinterpret_cast<const char*>(a) + 16 * lda_bytes;
  _tile_loadd(6, a, lda_bytes);
  _tile_loadd(7, b, B_STRIDE);
  _tile_dpbf16ps(0, 6, 7);
  if (two) {
    _tile_loadd(6, lower, lda_bytes);
    _tile_dpbf16ps(3, 6, 7);
    _tile_loadd(7, b + 16 * 2, B_STRIDE);
    _tile_dpbf16ps(4, 6, 7);
    _tile_loadd(6, a, lda_bytes);
    _tile_dpbf16ps(1, 6, 7);
    _tile_loadd(7, b + 32 * 2, B_STRIDE);
    _tile_dpbf16ps(2, 6, 7);
    _tile_loadd(6, lower, lda_bytes);
    _tile_dpbf16ps(5, 6, 7);
  } else {
    _tile_loadd(7, b + 16 * 2, B_STRIDE);
    _tile_dpbf16ps(1, 6, 7);
    _tile_loadd(7, b + 32 * 2, B_STRIDE);
    _tile_dpbf16ps(2, 6, 7);
  }
}

// The block's C tiles to `to`, float32 rows `ld` apart (the lower three only where `two`: a block
// of more than 16 rows).
static inline void amx_store_c(float* to, int64_t ld, bool two = true) {
  const int64_t stride = ld * int64_t(sizeof(float));
  _tile_stored(0, to, stride);
  _tile_stored(1, to + 16, stride);
  _tile_stored(2, to + 32, stride);
  if (!two) return;
  _tile_stored(3, to + 16 * ld, stride);
  _tile_stored(4, to + 16 * ld + 16, stride);
  _tile_stored(5, to + 16 * ld + 32, stride);
}

// The block's tiles to C at [i0, j0]: `rows` x `cols`, through the epilogue of `e`.
static void amx_store(int rows, int cols, int64_t i0, int64_t j0, void* c, int64_t ldc, const Epilogue* e) {
  const bool two = rows > 16;
  if (rows == AMX_ROWS && cols == NR && !(e && e->out_bf16)) {  // whole and float32: the tiles straight to C
    float* out = static_cast<float*>(c) + i0 * ldc + j0;
    amx_store_c(out, ldc);
    if (e && (e->unary || e->residual)) {  // (the bias is in the sums: the tiles started from it)
      epilogue_in_place<16, NV>(out, ldc, i0, j0, *e);
      epilogue_in_place<16, NV>(out + 16 * ldc, ldc, i0 + 16, j0, *e);
    }
    return;
  }
  float* block = thread_block_buffer(AMX_ROWS * NR);
  amx_store_c(block, NR, two);
  if (rows == AMX_ROWS && cols == NR) {  // whole, bfloat16: the epilogue on the buffer, then each row rounded into C
    if (e->bias || e->unary || e->residual) {
      epilogue_in_place<16, NV>(block, NR, i0, j0, *e);
      epilogue_in_place<16, NV>(block + 16 * NR, NR, i0 + 16, j0, *e);
    }
    kiln_bf16* out = static_cast<kiln_bf16*>(c) + i0 * ldc + j0;
    for (int r = 0; r < AMX_ROWS; ++r)
#pragma GCC unroll 3
      for (int v = 0; v < NV; ++v) kiln::store_bf16(out + r * ldc + v * L, kiln::load(block + r * NR + v * L));
    return;
  }
  for (int r0 = 0; r0 < rows; r0 += MR) {
    V acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = kiln::load(block + (r0 + r) * NR + v * L);
    store_block<MR>(acc, std::min(MR, rows - r0), cols, i0 + r0, j0, c, ldc, e, true);
  }
}

// A [M, K] of T as bfloat16 [parts][rows, cols] (rows, cols at least M, K), zeros around it:
// bfloat16 A as it is; float32 A rounded to nearest even (as convert_a_bf16 rounds: bfloat16 fast
// math), and with more than one part each part the rounded remainder of the ones before. Three
// parts hold a float32 exactly (8 significant bits each of its 24; a part below bfloat16's normal
// range, for |a| under ~2^-110, is read by AMX as zero).
template <typename T>
static std::unique_ptr<kiln_bf16[]> amx_padded_a(int64_t M, int64_t K, const T* a, int64_t lda, int64_t rows,
                                                  int64_t cols, int parts = 1) {
  std::unique_ptr<kiln_bf16[]> out(new kiln_bf16[parts * rows * cols]);  // (tile loads need no alignment)
#pragma omp parallel for if (rows * cols >= (int64_t(1) << 16)) num_threads(kiln::team())
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = i < M ? K : 0;
    for (int part = 0; part < parts; ++part) {
      kiln_bf16* dst = out.get() + (part * rows + i) * cols;
      if constexpr (std::is_same_v<T, kiln_bf16>) {
        if (n) std::memcpy(dst, a + i * lda, n * sizeof(kiln_bf16));
      } else {
        auto rest = [&](int64_t k) {  // a's remainder after the parts before this one
          float r = a[i * lda + k];
          for (int q = 0; q < part; ++q) r -= float(out[(q * rows + i) * cols + k]);
          return r;
        };
        int64_t k = 0;
        for (; k + L <= n; k += L) {
          V r = kiln::load(a + i * lda + k);
          for (int q = 0; q < part; ++q) r -= kiln::load_bf16(out.get() + (q * rows + i) * cols + k);
          kiln::store_bf16(dst + k, r);
        }
        for (; k < n; ++k) dst[k] = kiln_bf16(rest(k));
      }
      std::memset(static_cast<void*>(dst + n), 0, (cols - n) * sizeof(kiln_bf16));
    }
  }
  return out;
}

// Where the AMX product finds panel p's pair rows ([K/2][NR][2], pack_b's layout): packed once
// (these), or made per call from a quantized weight (kiln_gemm_quant.h QuantPairPanels,
// QuantLevelPanels), which a thread makes once per panel (`made`: the rows in one pass, no panel
// asked for before it is made). `parts`: A's bfloat16 parts (amx_padded_a). `scaled`: the panel
// holds levels, and the sums are multiplied by its columns' scales (`scales()`, of the last panel
// the thread made) before the epilogue. `weight_parts` 2: the panel's weights in two bfloat16
// parts, the second `low_part()` elements after the first, and each step sums A's first part
// times the second too (QuantSplitPanels). `whole_steps`: the panel's pair rows run on to whole
// steps of AMX_K, zeros past K (no tail to copy).
struct PackedPairs {
  static constexpr bool made = false, scaled = false, whole_steps = false;
  static constexpr int parts = 1, weight_parts = 1;
  int64_t low_part() const { return 0; }
  const kiln_bf16* bp;
  int64_t pairs;
  const kiln_bf16* operator()(int64_t p) const { return bp + p * pairs * 2 * NR; }
  const float* scales() const { return nullptr; }
};

// The six C tiles of a block: all from one row (`start`, stride 0), or from a [32][NR] buffer.
static inline void amx_load_c(const float* from, int64_t stride) {
  _tile_loadd(0, from, stride);
  _tile_loadd(1, from + 16, stride);
  _tile_loadd(2, from + 32, stride);
  const float* lower = stride ? from + 16 * NR : from;
  _tile_loadd(3, lower, stride);
  _tile_loadd(4, lower + 16, stride);
  _tile_loadd(5, lower + 32, stride);
}

// C = epilogue(A @ B) on AMX's tiles: A [M, K] (row stride lda) bfloat16, or float32 rounded to
// bfloat16 on the way in (fast math); B's pair panels where `panel_of` finds them (PackedPairs).
template <typename T, typename PanelOf>
static void amx_product(int64_t M, int64_t N, int64_t K, const T* a_in, int64_t lda, const PanelOf& panel_of,
                        void* c, int64_t ldc, const Epilogue* e) {
  const int64_t pairs = round_even(K) / 2, steps = (K + AMX_K - 1) / AMX_K;
  const int64_t panels = (N + NR - 1) / NR, blocks = (M + AMX_ROWS - 1) / AMX_ROWS;
  std::unique_ptr<kiln_bf16[]> padded;
  const kiln_bf16* a;
  if constexpr (std::is_same_v<T, kiln_bf16>) a = a_in;
  if (!std::is_same_v<T, kiln_bf16> || M % AMX_ROWS || K % AMX_K || PanelOf::parts > 1) {
    padded = amx_padded_a(M, K, a_in, lda, blocks * AMX_ROWS, steps * AMX_K, PanelOf::parts);
    a = padded.get(), lda = steps * AMX_K;
  }
  const int64_t part_stride = blocks * AMX_ROWS * lda;  // (between A's parts)
  const int64_t lda_bytes = lda * int64_t(sizeof(kiln_bf16));
  const int64_t tail_pairs = pairs - (steps - 1) * (AMX_K / 2);  // the last step's pair rows (16: whole)
#pragma omp parallel if (panels * blocks > 1) num_threads(kiln::team())
  {
    const AmxConfig config;
    _tile_loadconfig(&config);
    const auto [p0, p1, r0, r1] = thread_share(N, panels, blocks, PanelOf::made);
    alignas(64) kiln_bf16 tail[AMX_K / 2 * NR * 2];  // a panel's last step, zero-padded
    // Blocks per pass over the thread's panels: their A rows (about 1 MB) stay in L2 while the
    // panels go past, where a large M would otherwise read all of A from L3 once per panel.
    // (Panels made per call are made once: all the thread's rows in one pass.)
    const int64_t pass = KILN_GEMM_AMX_PASS_KB && !PanelOf::made
                             ? std::max<int64_t>(1, (int64_t(KILN_GEMM_AMX_PASS_KB) << 10) / (AMX_ROWS * lda_bytes))
                             : std::max<int64_t>(1, r1 - r0);
    // Blocks [b0, b1) of panel p; `more`: the thread has a next panel.
    auto amx_panel = [&](int64_t p, int64_t b0, int64_t b1, bool more) {
      const kiln_bf16* panel = panel_of(p);
      if (!PanelOf::whole_steps && tail_pairs < AMX_K / 2) {
        const int64_t whole = tail_pairs * NR * 2;
        std::memcpy(tail, panel + (steps - 1) * AMX_K * NR, whole * sizeof(kiln_bf16));
        std::memset(static_cast<void*>(tail + whole), 0, sizeof(tail) - whole * sizeof(kiln_bf16));
      }
      const int cols = int(std::min<int64_t>(NR, N - p * NR));
      // The bias is where the sums start (each tile's rows loaded from one row, stride 0), so a
      // block with no other epilogue goes to C as the tiles hold it.
      alignas(64) float start[NR] = {};
      Epilogue rest;  // the epilogue after the sums: e's, less the bias
      const Epilogue* after = e;
      if (e && e->bias) {
        for (int j = 0; j < cols; ++j) start[j] = load_n(at(e->bias, e->bias_bf16, p * NR + j), e->bias_bf16, 1)[0];
        rest = *e, rest.bias = nullptr, after = &rest;
      }
      for (int64_t rb = b0; rb < b1; ++rb) {
        const int64_t i0 = rb * AMX_ROWS;
        const int rows = int(std::min<int64_t>(AMX_ROWS, M - i0));
        const bool two = rows > 16;
        const kiln_bf16* rows_a = a + i0 * lda;
        // The panel's first block asks for its steps AHEAD steps ahead; the last block, for the
        // next panel's first steps.
        const bool first_block = rb == b0, last_block = rb + 1 == b1 && more && !PanelOf::made;
        // The sums start from the bias, or from zero where they are scaled after.
        if constexpr (PanelOf::scaled) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          _tile_zero(4);
          _tile_zero(5);
        } else {
          amx_load_c(start, 0);
        }
        for (int64_t s = 0; s < steps; ++s) {
          const kiln_bf16* b =
              !PanelOf::whole_steps && s + 1 == steps && tail_pairs < AMX_K / 2 ? tail : panel + s * AMX_K * NR;
          if (KILN_GEMM_AMX_AHEAD) {
            const int64_t t = s + KILN_GEMM_AMX_AHEAD;
            const char* ahead = first_block && t < steps ? reinterpret_cast<const char*>(panel + t * AMX_K * NR)
                                : last_block && t >= steps && t - steps < steps
                                    ? reinterpret_cast<const char*>(panel + (pairs * 2 + (t - steps) * AMX_K) * NR)
                                    : nullptr;
            if (ahead)
              for (int l = 0; l < AMX_K * NR * 2 / 64; ++l) _mm_prefetch(ahead + l * 64, _MM_HINT_T0);
          }
          for (int part = 0; part < PanelOf::parts; ++part)
            amx_step(rows_a + part * part_stride + s * AMX_K, lda_bytes, b, two);
          if constexpr (PanelOf::weight_parts == 2) amx_step(rows_a + s * AMX_K, lda_bytes, b + panel_of.low_part(), two);
        }
        if constexpr (PanelOf::scaled) {  // sums * scales + bias, back into the tiles
          alignas(64) float sums[AMX_ROWS * NR];
          amx_store_c(sums, NR);
          const float* scale = panel_of.scales();
          for (int r = 0; r < AMX_ROWS; ++r)
#pragma GCC unroll 3
            for (int v = 0; v < NV; ++v) {
              float* at_sum = sums + r * NR + v * L;
              kiln::store(at_sum, fma(kiln::load(at_sum), kiln::load(scale + v * L), kiln::load(start + v * L)));
            }
          amx_load_c(sums, NR * sizeof(float));
        }
        amx_store(rows, cols, i0, p * NR, c, ldc, after);
      }
    };
    for (int64_t b0 = r0; b0 < r1; b0 += pass) {
      const int64_t b1 = std::min(r1, b0 + pass);
      for (int64_t p = p0; p < p1; ++p) amx_panel(p, b0, b1, p + 1 < p1);
    }
    _tile_release();
    if (e && e->row_norm) {
#pragma omp barrier
      norm_rows(static_cast<float*>(c), ldc, M, N, *e, omp_get_thread_num(), omp_get_num_threads());
    }
  }
}

// C = epilogue(A @ B) on AMX's tiles: A bfloat16 [M, K] (row stride lda), B kiln's pair panels.
static void gemm_bf16_amx(int64_t M, int64_t N, int64_t K, const kiln_bf16* a, int64_t lda, const kiln_bf16* bp,
                          void* c, int64_t ldc, const Epilogue* e) {
  amx_product(M, N, K, a, lda, PackedPairs{bp, round_even(K) / 2}, c, ldc, e);
}

}  // namespace kiln_gemm
#endif
