// layers/functional.cpp: see functional.h.
#include "layers/functional.h"

#include <cmath>

#include "layers/compute_copy.h"
#include "layers/widened_products.h"

namespace retort::layers {

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  // Reduced precision inputs are normalised in float32, as HF LlamaRMSNorm does.
  const auto compute = x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  torch::Tensor xc = x.to(compute);
  torch::Tensor inv = torch::rsqrt(xc.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (xc * inv).to(x.scalar_type()) * in_type_of(weight, x);
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t seq_len,
                                                    const RopeFrequencies& frequencies,
                                                    int64_t offset, torch::TensorOptions options) {
  auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor positions = torch::arange(offset, offset + seq_len, f64);
  torch::Tensor freqs = torch::outer(positions, frequencies.inverse);
  torch::Tensor angles = torch::cat({freqs, freqs}, -1);
  torch::Tensor cos = angles.cos(), sin = angles.sin();
  if (frequencies.attention_factor != 1.0) {
    cos = cos * frequencies.attention_factor;
    sin = sin * frequencies.attention_factor;
  }
  return {cos.to(options), sin.to(options)};
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double theta,
                                                    int64_t offset, torch::TensorOptions options) {
  return rope_tables(seq_len, rope_frequencies(head_dim, theta), offset, options);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  if (cos.scalar_type() == x.scalar_type()) return x * cos + rotated * sin;
  // 16-bit activations rotate by float32 tables in float32 and are rounded once.
  return (x.to(cos.scalar_type()) * cos + rotated.to(cos.scalar_type()) * sin).to(x.scalar_type());
}

torch::Tensor attention_mask(int64_t q_len, int64_t k_len, int64_t q_offset, int64_t window,
                             torch::TensorOptions options) {
  auto i64 = torch::TensorOptions().dtype(torch::kLong);
  torch::Tensor qi = torch::arange(q_offset, q_offset + q_len, i64).unsqueeze(1);
  torch::Tensor kj = torch::arange(0, k_len, i64).unsqueeze(0);
  torch::Tensor visible = kj <= qi;
  if (window > 0) visible = visible & ((qi - kj) < window);
  torch::Tensor mask = torch::zeros({q_len, k_len}, options);
  return mask.masked_fill(visible.logical_not().to(mask.device()),
                          -std::numeric_limits<double>::infinity());
}

torch::Tensor grouped_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& mask) {
  const int64_t b = q.size(0), heads = q.size(1), s = q.size(2), d = q.size(3);
  const int64_t kv_heads = k.size(1), group = heads / kv_heads;
  // Fold the query heads of one group next to each other instead of copying k and v.
  torch::Tensor qg = q.reshape({b, kv_heads, group * s, d});
  torch::Tensor scores = matmul_widening(qg, k.transpose(-1, -2)) / std::sqrt(double(d));
  scores = scores.view({b, kv_heads, group, s, k.size(2)}) + mask;
  torch::Tensor probs = torch::softmax(scores, -1).view({b, kv_heads, group * s, k.size(2)});
  return matmul_widening(probs, v).view({b, heads, s, d});
}

torch::Tensor library_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, int64_t window) {
  const int64_t s = q.size(2);
  if (window <= 0 || window >= s)
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                            /*enable_gqa=*/true);
  const auto positions = torch::arange(s, q.options().dtype(torch::kLong));
  const torch::Tensor distance = positions.unsqueeze(1) - positions.unsqueeze(0);  // i - j
  const torch::Tensor visible = distance.ge(0) & distance.lt(window);
  return at::scaled_dot_product_attention(q, k, v, visible, 0.0, /*is_causal=*/false, std::nullopt,
                                          /*enable_gqa=*/true);
}

}  // namespace retort::layers
