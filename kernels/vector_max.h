// kernels/vector_max.h: the largest of n values in a form GCC vectorises inside the per-ISA
// kernel loops (kernels/isa_variants.h). Written as `omp simd reduction(max)` over std::max, GCC
// leaves the loop scalar (a max reduction needs -ffinite-math-only: std::max is not IEEE max),
// one vmaxss per value in a dependent chain; the lane-wise select below is one vmaxps per 16.
// NaN values are skipped, as std::max(m, x) skips them; n = 0 gives -inf. bf16 values give
// their float32 maximum.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/bfloat16.h"
#include "kernels/isa_variants.h"

namespace retort::kernels {

template <typename T>
RETORT_ALWAYS_INLINE auto max_of(const T* __restrict x, int64_t n) {
  using V = decltype(widen(x[0]));  // bf16 values are compared widened to float32
  constexpr int64_t kLanes = 64 / sizeof(V);
  V lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -std::numeric_limits<V>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int64_t i = 0; i < kLanes; ++i) {
      const V v = widen(x[j + i]);
      lanes[i] = v > lanes[i] ? v : lanes[i];
    }
  }
  for (int64_t i = 0; j < n; ++i, ++j) {
    const V v = widen(x[j]);
    lanes[i] = v > lanes[i] ? v : lanes[i];
  }
  V m = lanes[0];
  for (int64_t i = 1; i < kLanes; ++i) m = lanes[i] > m ? lanes[i] : m;
  return m;
}

}  // namespace retort::kernels
