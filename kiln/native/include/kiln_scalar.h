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
