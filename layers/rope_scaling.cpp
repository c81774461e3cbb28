// layers/rope_scaling.cpp: see rope_scaling.h.
#include "layers/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace retort::layers {
namespace {

constexpr double kTwoPi = 2.0 * M_PI;

// Llama 3.1's: pairs turning more slowly than the original context are slowed by `factor`,
// those turning faster than original_context / high_freq_factor kept, the ones between
// blended by where their wavelength falls.
void llama3(std::vector<double>& inverse, const ModelConfig& c) {
  const double context = double(c.rope_original_context);
  const double low = c.rope_low_freq_factor, high = c.rope_high_freq_factor;
  const double low_freq_wavelength = context / low, high_freq_wavelength = context / high;
  for (double& f : inverse) {
    const double wavelength = kTwoPi / f;
    if (wavelength > low_freq_wavelength) {
      f /= c.rope_factor;
    } else if (!(wavelength < high_freq_wavelength)) {
      const double smooth = (context / wavelength - low) / (high - low);
      f = (1 - smooth) * f / c.rope_factor + smooth * f;
    }
  }
}

// YaRN's: pairs below the correction range (more than beta_fast turns over the original
// context) kept, those above it (fewer than beta_slow) divided by `factor`, a linear ramp
// between; the tables scaled by the attention factor.
double yarn(std::vector<double>& inverse, const ModelConfig& c) {
  const double dim = double(c.head_dim()), base = c.rope_theta;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(double(c.rope_original_context) / (rotations * kTwoPi)) /
           (2 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(c.rope_beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(c.rope_beta_slow)), dim - 1);
  if (low == high) high += 0.001;  // as transformers avoids the division by zero
  for (size_t i = 0; i < inverse.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double kept = 1 - ramp;  // the share extrapolated (left as it is)
    inverse[i] = inverse[i] / c.rope_factor * (1 - kept) + inverse[i] * kept;
  }
  if (c.rope_attention_factor > 0) return c.rope_attention_factor;
  return c.rope_factor <= 1 ? 1.0 : 0.1 * std::log(c.rope_factor) + 1.0;
}

}  // namespace

RopeFrequencies rope_frequencies(int64_t head_dim, double theta) {
  auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor exponents = torch::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim);
  return {torch::pow(theta, -exponents), 1.0};
}

RopeFrequencies rope_frequencies(const ModelConfig& config) {
  RopeFrequencies frequencies = rope_frequencies(config.head_dim(), config.rope_theta);
  if (config.rope_scaling == RopeScaling::none) return frequencies;
  torch::Tensor& inverse = frequencies.inverse;
  std::vector<double> f(inverse.data_ptr<double>(), inverse.data_ptr<double>() + inverse.numel());
  switch (config.rope_scaling) {
    case RopeScaling::linear:
      for (double& x : f) x /= config.rope_factor;
      break;
    case RopeScaling::llama3:
      llama3(f, config);
      break;
    case RopeScaling::yarn:
      frequencies.attention_factor = yarn(f, config);
      break;
    case RopeScaling::none:
      break;
  }
  inverse = torch::tensor(f, inverse.options());
  return frequencies;
}

}  // namespace retort::layers
