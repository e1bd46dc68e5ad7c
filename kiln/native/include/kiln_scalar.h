// Scalar helpers of kiln's kernels: eager's NaN-propagating max/min, floor division and
// remainder with Python's signs, and indirect indices that flag (not fault) when out of range.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
template <typename T> static inline T kiln_max(T a, T b) { if (a != a) return a; if (b != b) return b; return a > b ? a : b; }
template <typename T> static inline T kiln_min(T a, T b) { if (a != a) return a; if (b != b) return b; return a < b ? a : b; }
extern "C" { KILN_INDEX_ERROR_DECL }
static inline int64_t kiln_index(int64_t i, int64_t size) {
  if (i < 0) i += size;
  if (i < 0 || i >= size) { kiln_index_error = 1; return i < 0 ? 0 : size - 1; }
  return i;
}
// ops.rand: Philox4x32-10 of the counter (offset, 0, 0) under the key (seed); the first word's top
// 24 bits over 2^24, a float in [0, 1). The same number as kiln/ir/philox.py and Triton's kiln_rand.
static inline float kiln_rand(int64_t seed, int64_t offset) {
  uint32_t c0 = uint32_t(uint64_t(offset)), c1 = uint32_t(uint64_t(offset) >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(uint64_t(seed)), k1 = uint32_t(uint64_t(seed) >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1); c3 = uint32_t(p0); c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return float(c0 >> 8) * (1.0f / 16777216.0f);
}
template <typename T> static inline bool kiln_gt(T a, T b) { return a > b || (a != a && b == b); }
template <typename T> static inline bool kiln_lt(T a, T b) { return a < b || (a != a && b == b); }
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::floor(a / b); }
  else { T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) --q; return q; }
}
template <typename T> static inline T kiln_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { T r = std::fmod(a, b); if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
  else { T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
}
