// kernels/vector_exp.h: exp in a form the compiler vectorises inside the per-ISA kernel loops
// (no libm call for float), shared by the block's kernels (kernels/row_loops.cpp) and the
// logit-loss kernels (kernels/logit_kernels.cpp). Include only from files built as kernel
// libraries (retort_kernel_library): the float form needs -fno-trapping-math to vectorise.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/isa_variants.h"

namespace retort::kernels {

// exp(x) for float: Cephes' range reduction x = n ln2 + r, |r| <= ln2/2, a degree-7
// polynomial for e^r and 2^n built from its bits. Relative error about 2 ulp; inputs are
// clamped to [-87, 88] (e^-87 ~ 1.6e-38), so exp(-inf) gives 1.6e-38, not 0.
RETORT_ALWAYS_INLINE float vector_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
RETORT_ALWAYS_INLINE double vector_exp(double x) {
  return std::exp(x);
}

}  // namespace retort::kernels
