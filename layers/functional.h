// layers/functional.h: the stateless maths of a Llama block: RMSNorm, rotary embeddings in
// the Hugging Face rotate-half convention, the causal / sliding-window mask, grouped-query
// attention on per-head tensors. Modules compose these; tests check them against an
// independent per-head reference.
#pragma once
#include <torch/torch.h>

#include "layers/rope_scaling.h"

namespace retort::layers {

// x * rsqrt(mean(x^2, -1) + eps) * weight, computed in float32 or wider.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// cos and sin tables [seq, head_dim] for positions offset .. offset+seq-1, from the model's
// frequencies (rope_scaling.h), or plain RoPE's of head_dim and theta.
std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t seq_len,
                                                    const RopeFrequencies& frequencies,
                                                    int64_t offset, torch::TensorOptions options);
std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double theta,
                                                    int64_t offset, torch::TensorOptions options);
// Applies RoPE to x [batch, heads, seq, head_dim].
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin);

// Additive mask [q_len, k_len] (0 or -inf): key j visible to query i when
// j <= i and (window == 0 or i - j < window). Queries sit at positions q_offset + i.
torch::Tensor attention_mask(int64_t q_len, int64_t k_len, int64_t q_offset, int64_t window,
                             torch::TensorOptions options);

// Softmax attention: q [b, heads, s, d], k and v [b, kv_heads, s, d], heads a multiple of
// kv_heads (each kv head serves heads/kv_heads consecutive query heads, as in HF repeat_kv).
torch::Tensor grouped_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& mask);

// The same attention, causal over one whole sequence (query i at position i) and limited to
// `window` keys when window > 0, by ATen's scaled-dot-product attention (grouped heads as
// above). Its CPU kernel keeps the scores, softmax and sums in float32 for 16-bit tensors.
torch::Tensor library_attention(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, int64_t window);

}  // namespace retort::layers
