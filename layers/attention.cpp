// layers/attention.cpp: see attention.h.
#include "layers/attention.h"

#include <cmath>

#include "layers/functional.h"

namespace retort::layers {

Attention::Attention(const ModelConfig& c, const std::string& p, int64_t window,
                     ParameterStore& store, const TensorParallel& tp)
    : head_dim_(c.head_dim()), window_(window) {
  const int64_t h = c.hidden, d = c.head_dim();
  const double out_std = c.init_std / std::sqrt(2.0 * c.layers);  // Megatron's scaled init
  q_.emplace(LinearSpec{p + "q_proj", h, c.heads * d, c.init_std, c.qkv_bias}, store, tp);
  const LinearSpec k{p + "k_proj", h, c.kv_heads * d, c.init_std, c.qkv_bias};
  const LinearSpec v{p + "v_proj", h, c.kv_heads * d, c.init_std, c.qkv_bias};
  if (c.kv_heads % tp.size() == 0) {
    k_.emplace(k, store, tp);
    v_.emplace(v, store, tp);
  } else {  // fewer kv heads than ranks: the kv head of this rank's first query head
    const int64_t group = c.heads / c.kv_heads, heads_per_rank = c.heads / tp.size();
    const int64_t offset = (tp.rank() * heads_per_rank / group) * d;
    k_.emplace(k, store, offset, d);
    v_.emplace(v, store, offset, d);
  }
  o_.emplace(LinearSpec{p + "o_proj", c.heads * d, h, out_std, false}, store, tp);
}

torch::Tensor Attention::forward(const torch::Tensor& x, const torch::Tensor& rope_cos,
                                 const torch::Tensor& rope_sin, const torch::Tensor& mask,
                                 const RecomputePolicy& recompute) const {
  const int64_t b = x.size(0), s = x.size(1);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, s, -1, head_dim_}).transpose(1, 2);  // [b, local heads, s, d]
  };
  torch::Tensor q = apply_rope(heads(q_->forward(x)), rope_cos, rope_sin);
  torch::Tensor k = apply_rope(heads(k_->forward(x)), rope_cos, rope_sin);
  torch::Tensor v = heads(v_->forward(x));
  torch::Tensor core;
  if (recompute.active(Checkpointing::selective)) {  // keep q, k, v; not the b x h x s x s part
    auto attend = [mask](const std::vector<torch::Tensor>& in) {
      return std::vector<torch::Tensor>{grouped_attention(in[0], in[1], in[2], mask)};
    };
    core = run_recomputed(attend, {q, k, v}, recompute.offloader)[0];
  } else {
    core = grouped_attention(q, k, v, mask);
  }
  torch::Tensor out = core.transpose(1, 2).reshape({b, s, -1});
  return o_->forward(out);
}

}  // namespace retort::layers
