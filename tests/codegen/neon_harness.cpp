// A main() for kiln's own CPU kernels built for aarch64 (tests/codegen/test_neon_cross.py): the
// test appends it to kernels_unit.source(), so the GEMM (float and quantized), the depthwise
// convolution and the vector math are the very code kiln compiles for the host. It only runs them: requests come on stdin (a
// line of words, then the operands' raw bytes), results go to stdout as raw bytes, and Python
// computes the references and compares (the same helpers as the x86 tests).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace neon_harness {
using kiln_gemm::V;

[[noreturn]] static void fail(const char* what) {
  std::fprintf(stderr, "neon harness: %s\n", what);
  std::exit(2);
}

template <class T> static std::vector<T> read(int64_t n) {
  std::vector<T> v(size_t(n > 0 ? n : 0));
  if (std::fread(v.data(), sizeof(T), v.size(), stdin) != v.size()) fail("short input");
  return v;
}

template <class T> static void write(const std::vector<T>& v) { std::fwrite(v.data(), sizeof(T), v.size(), stdout); }

// "blocking": the register blocking this build chose, as int32 [MR, NV, L, NR].
static void blocking() { write(std::vector<int32_t>{kiln_gemm::MR, kiln_gemm::NV, kiln::L, kiln_gemm::NR}); }

// "gemm_f32" or "gemm_bf16" (the operands' type), then "M N K lda ldc kc bias residual
// residual_bf16 out_bf16 unary scalar0 scalar1": in: A [M, lda] (the GEMM reads K columns of it),
// B [K, N], bias [N] and residual [M, N] when flagged (the bias in the operands' type); out:
// C [M, ldc]. C starts as all-ones bytes (NaN), so Python can tell that the columns past N were
// left alone.
template <class T> static void gemm(const char* words) {
  long long M, N, K, lda, ldc, kc;
  int bias, residual, residual_bf16, out_bf16, unary;
  float s0, s1;
  if (std::sscanf(words, "%lld %lld %lld %lld %lld %lld %d %d %d %d %d %f %f", &M, &N, &K, &lda, &ldc, &kc, &bias,
                  &residual, &residual_bf16, &out_bf16, &unary, &s0, &s1) != 13)
    fail("gemm: bad request");
  const auto a = read<T>(M * lda), b = read<T>(K * N), bias_v = read<T>(bias ? N : 0);
  const auto residual_v = read<char>(residual ? M * N * (residual_bf16 ? 2 : 4) : 0);
  std::vector<T> panels(size_t(kiln_gemm::packed_elements<T>(K, N)));
  kiln_gemm::pack_b(b.data(), K, N, N, 1, panels.data());
  std::vector<char> c(size_t(M * ldc * (out_bf16 ? 2 : 4)), char(0xff));
  const kiln_gemm::Epilogue e{bias ? bias_v.data() : nullptr, residual ? residual_v.data() : nullptr, N,
                              std::is_same_v<T, kiln_bf16>, residual_bf16, out_bf16, unary, s0, s1};
  // No epilogue at all is a null pointer, as kiln_gemm.epilogue() gives it.
  const bool any = bias || residual || out_bf16 || unary;
  kiln_gemm::gemm<T>(M, N, K, a.data(), lda, panels.data(), c.data(), ldc, any ? &e : nullptr, kc);
  write(c);
}

// "gemm_quant bits M N K group kc bias residual unary scalar0 scalar1 int8_activations path": kiln's
// quantized GEMM (kiln_gemm_quant.h) as kiln/quant's weights reach it; `path` >= 0: at 4 rows or
// fewer by that path (kiln_gemm::QuantPath) rather than the one it takes by default. in: A
// [M, K] float32, q (bits 8: [N, K] int8, group K; bits 4: [N, ceil(K / 2)] bytes), scales
// [N, groups] and (bits 4) zeros [N, groups] float32, bias [N] and residual [M, N] float32 when
// flagged; out: C [M, N].
static void gemm_quant(const char* words) {
  int bits, bias, residual, unary, int8_activations, path;
  long long M, N, K, group, kc;
  float s0, s1;
  if (std::sscanf(words, "%d %lld %lld %lld %lld %lld %d %d %d %f %f %d %d", &bits, &M, &N, &K, &group, &kc, &bias,
                  &residual, &unary, &s0, &s1, &int8_activations, &path) != 13)
    fail("gemm_quant: bad request");
  const kiln_gemm::QuantShape z{bits, K, N, group};
  const auto a = read<float>(M * K);
  const auto q = read<uint8_t>(bits == 8 ? N * K : N * ((K + 1) / 2));
  const auto scales = read<float>(N * z.groups()), zeros = read<float>(bits == 4 ? N * z.groups() : 0);
  const auto bias_v = read<float>(bias ? N : 0), residual_v = read<float>(residual ? M * N : 0);
  std::vector<uint8_t> packed(size_t(z.bytes()));
  kiln_gemm::pack_quant(z, q.data(), scales.data(), bits == 4 ? zeros.data() : nullptr, packed.data());
  std::vector<float> c(size_t(M * N));
  const kiln_gemm::Epilogue e{bias ? bias_v.data() : nullptr, residual ? residual_v.data() : nullptr, N, false, false,
                              false, unary, s0, s1};
  const kiln_gemm::Epilogue* post = bias || residual || unary ? &e : nullptr;
  if (int8_activations)
    kiln_gemm::gemm_quant_int8_activations(z, M, a.data(), K, packed.data(), c.data(), N, post, kc, true);
  else if (path >= 0 && bits == 8)
    kiln_gemm::gemm_quant_direct(kiln_gemm::QuantPanels<8>{z, packed.data()}, M, a.data(), K, c.data(), N, post, path);
  else if (path >= 0)
    kiln_gemm::gemm_quant_direct(kiln_gemm::QuantPanels<4>{z, packed.data()}, M, a.data(), K, c.data(), N, post, path);
  else
    kiln_gemm::gemm_quant(z, M, a.data(), K, packed.data(), c.data(), N, post, kc);
  write(c);
}

// "quant_paths M K N group": int32 [the path an int4 product of M rows takes (kiln_gemm::QuantPath),
// whether int8 activations take the integer path, the path an int8 product of M rows takes, the
// digits the digits path carries activations in over int4 weights, over int8 weights].
static void quant_paths(const char* words) {
  long long M, K, N, group;
  if (std::sscanf(words, "%lld %lld %lld %lld", &M, &K, &N, &group) != 4) fail("quant_paths: bad request");
  const kiln_gemm::QuantShape z{4, K, N, group}, z8{8, K, N, K};
  write(std::vector<int32_t>{kiln_gemm::quant_path_for(z, M), int32_t(kiln_gemm::int8_dot_applies(z, M)),
                             kiln_gemm::quant_path_for(z8, M), kiln_gemm::activation_digits(4),
                             kiln_gemm::activation_digits(8)});
}

// "depthwise N H W C KH KW OH OW sh sw ph pw dh dw bias other unary scalar0 scalar1": in: x [N, H,
// W, C], weight [C, KH, KW], bias [C] and other [N, OH, OW, C] when flagged; out: y [N, OH, OW, C].
static void depthwise(const char* words) {
  kiln_depthwise::Shape s;
  int bias, other, unary;
  float s0, s1;
  if (std::sscanf(words, "%ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %d %d %d %f %f", &s.N, &s.H, &s.W,
                  &s.C, &s.KH, &s.KW, &s.OH, &s.OW, &s.sh, &s.sw, &s.ph, &s.pw, &s.dh, &s.dw, &bias, &other, &unary,
                  &s0, &s1) != 19)
    fail("depthwise: bad request");
  const auto x = read<float>(s.N * s.H * s.W * s.C), w = read<float>(s.C * s.KH * s.KW);
  const auto bias_v = read<float>(bias ? s.C : 0), other_v = read<float>(other ? s.N * s.OH * s.OW * s.C : 0);
  std::vector<float> packed(w.size()), y(size_t(s.N * s.OH * s.OW * s.C));
  kiln_depthwise::pack_weight(w.data(), s.C, s.KH * s.KW, packed.data());
  kiln_gemm::Epilogue e{};
  e.unary = unary, e.scalar0 = s0, e.scalar1 = s1;
  kiln_depthwise::conv(s, x.data(), packed.data(), bias ? bias_v.data() : nullptr, other ? other_v.data() : nullptr,
                       y.data(), e);
  write(y);
}

// "vmath <name> n": in: x [n] float32; out: kiln_v<name>(x) computed a NEON vector at a time, the
// last, partly filled vector padded with ones.
static void vmath(const char* words) {
  char name[16];
  long long n;
  if (std::sscanf(words, "%15s %lld", name, &n) != 2) fail("vmath: bad request");
  V (*f)(V) = !std::strcmp(name, "exp") ? kiln_vexp<V> : !std::strcmp(name, "log") ? kiln_vlog<V>
            : !std::strcmp(name, "erf") ? kiln_verf<V> : !std::strcmp(name, "tanh") ? kiln_vtanh<V>
            : !std::strcmp(name, "sigmoid") ? kiln_vsigmoid<V> : nullptr;
  if (!f) fail("vmath: unknown function");
  const auto x = read<float>(n);
  std::vector<float> y(x.size());
  for (long long i = 0; i < n; i += kiln::L) {
    const size_t k = size_t(std::min<long long>(kiln::L, n - i));
    V v = 1.0f - V{};
    std::memcpy(&v, &x[i], k * sizeof(float));
    const V r = f(v);
    std::memcpy(&y[i], &r, k * sizeof(float));
  }
  write(y);
}

// "round_fp16 n": in: x [n] float32; out: kiln_round_fp16(x), through float16 and back (kiln_half.h
// builds its float16 on aarch64's __fp16 where g++ lacks _Float16: kiln_vec.h).
static void round_fp16(const char* words) {
  long long n;
  if (std::sscanf(words, "%lld", &n) != 1) fail("round_fp16: bad request");
  auto x = read<float>(n);
  for (float& v : x) v = kiln_round_fp16(v);
  write(x);
}
}  // namespace neon_harness

int main() {
  char line[512], op[16];
  int at;
  while (std::fgets(line, sizeof line, stdin)) {
    if (std::sscanf(line, "%15s %n", op, &at) != 1) neon_harness::fail("empty request");
    const char* words = line + at;
    if (!std::strcmp(op, "blocking")) neon_harness::blocking();
    else if (!std::strcmp(op, "gemm_f32")) neon_harness::gemm<float>(words);
    else if (!std::strcmp(op, "gemm_bf16")) neon_harness::gemm<kiln_bf16>(words);
    else if (!std::strcmp(op, "gemm_quant")) neon_harness::gemm_quant(words);
    else if (!std::strcmp(op, "quant_paths")) neon_harness::quant_paths(words);
    else if (!std::strcmp(op, "depthwise")) neon_harness::depthwise(words);
    else if (!std::strcmp(op, "vmath")) neon_harness::vmath(words);
    else if (!std::strcmp(op, "round_fp16")) neon_harness::round_fp16(words);
    else neon_harness::fail("unknown request");
  }
  return 0;
}
