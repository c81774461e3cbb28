// engine/optim/adamw_kernel.cpp: see adamw_kernel.h. The loop follows the composed ops'
// order of operations (decay, moments, denominator, update) so both forms agree to
// round-off; compiled per ISA (common/simd_clones.h).
#include "engine/optim/adamw_kernel.h"

#include <cmath>

#include "common/simd_clones.h"

namespace retort::engine::kernels {
namespace {

template <typename T>
RETORT_ALWAYS_INLINE void update_all(T* __restrict value, const T* __restrict grad, T* __restrict m,
                                     T* __restrict v, int64_t count, const AdamWCoefficients& c) {
  const T decay = T(c.decay_factor), beta1 = T(c.beta1), beta2 = T(c.beta2);
  const T one_minus_beta1 = T(1.0 - c.beta1), one_minus_beta2 = T(1.0 - c.beta2);
  const T eps = T(c.eps), sqrt_bias2 = T(c.sqrt_bias2), step_scale = T(c.step_scale);
  const T grad_scale = T(c.grad_scale);  // x * 1 is exact: unclipped steps are unchanged
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) {
    const T g = grad[i] * grad_scale;
    const T mi = m[i] * beta1 + g * one_minus_beta1;
    const T vi = v[i] * beta2 + one_minus_beta2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / sqrt_bias2 + eps;
    value[i] = value[i] * decay + step_scale * (mi / denom);
  }
}

}  // namespace

RETORT_SIMD_CLONES void adamw_update(float* value, const float* grad, float* m, float* v,
                                     int64_t count, const AdamWCoefficients& c) {
  update_all(value, grad, m, v, count, c);
}
RETORT_SIMD_CLONES void adamw_update(double* value, const double* grad, double* m, double* v,
                                     int64_t count, const AdamWCoefficients& c) {
  update_all(value, grad, m, v, count, c);
}

}  // namespace retort::engine::kernels
