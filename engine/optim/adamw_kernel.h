// engine/optim/adamw_kernel.h: the AdamW update as one pass over contiguous value, gradient
// and both moment buffers (the composed torch ops take five passes and a temporary for the
// denominator). No torch here; AdamW::update (adamw.cpp) splits the elements across threads.
#pragma once
#include <cstdint>

namespace retort::engine::kernels {

// The step's constants, with g = grad_scale * grad (the clip factor, applied here rather than
// in a pass of its own over every gradient): value *= decay_factor; m = beta1 m + (1 - beta1) g;
// v = beta2 v + (1 - beta2) g^2; value += step_scale * m / (sqrt(v) / sqrt_bias2 + eps).
struct AdamWCoefficients {
  double decay_factor;  // 1 - lr * weight_decay, or 1
  double beta1, beta2, eps;
  double sqrt_bias2;  // sqrt(1 - beta2^t)
  double step_scale;  // -lr / (1 - beta1^t)
  double grad_scale = 1.0;
};

void adamw_update(float* value, const float* grad, float* m, float* v, int64_t count,
                  const AdamWCoefficients& c);
void adamw_update(double* value, const double* grad, double* m, double* v, int64_t count,
                  const AdamWCoefficients& c);

}  // namespace retort::engine::kernels
