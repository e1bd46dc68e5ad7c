// 16-bit floats in memory, float32 in registers (eager computes bfloat16/float16 math in float32).
// Loads widen, stores round to nearest even; `round_bf16`/`round_fp16` give a float the precision
// of a cast to the 16-bit type, for casts in the middle of a computation.
#pragma once
#include <cstdint>
#include <cstring>

struct kiln_bf16 {
  uint16_t bits;
  kiln_bf16() = default;
  kiln_bf16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    bits = (f != f) ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  operator float() const { uint32_t u = uint32_t(bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
};

struct kiln_fp16 {
  uint16_t bits;
  kiln_fp16() = default;
  kiln_fp16(float f) { _Float16 h = static_cast<_Float16>(f); std::memcpy(&bits, &h, 2); }
  operator float() const { _Float16 h; std::memcpy(&h, &bits, 2); return static_cast<float>(h); }
};

static inline float kiln_round_bf16(float f) { return float(kiln_bf16(f)); }
static inline float kiln_round_fp16(float f) { return float(kiln_fp16(f)); }

namespace kiln {
static inline vec<float> load_bf16(const kiln_bf16* p) {
  vec<uint16_t> h; std::memcpy(&h, p, sizeof(h));
  vec<uint32_t> u = __builtin_convertvector(h, vec<uint32_t>) << 16;
  vec<float> f; std::memcpy(&f, &u, sizeof(f)); return f;
}
static inline vec<uint16_t> bf16_bits(vec<float> f) {
  vec<uint32_t> u; std::memcpy(&u, &f, sizeof(u));
  vec<uint32_t> rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  vec<uint32_t> nan = vec<uint32_t>{} + 0x7fc0u;
  return __builtin_convertvector(__builtin_convertvector(f != f, vec<int32_t>) ? nan : rounded, vec<uint16_t>);
}
static inline void store_bf16(kiln_bf16* p, vec<float> f) { vec<uint16_t> h = bf16_bits(f); std::memcpy(p, &h, sizeof(h)); }
static inline vec<float> round_bf16(vec<float> f) {
  vec<uint32_t> u = __builtin_convertvector(bf16_bits(f), vec<uint32_t>) << 16;
  vec<float> r; std::memcpy(&r, &u, sizeof(r)); return r;
}
static inline vec<float> load_fp16(const kiln_fp16* p) { return lanes<float>([&](int l) { return float(p[l]); }); }
static inline void store_fp16(kiln_fp16* p, vec<float> f) { for (int l = 0; l < L; ++l) p[l] = kiln_fp16(f[l]); }
static inline vec<float> round_fp16(vec<float> f) { return lanes<float>([&](int l) { return kiln_round_fp16(f[l]); }); }
}  // namespace kiln
