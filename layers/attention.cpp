// layers/attention.cpp: see attention.h.
#include "layers/attention.h"

#include <cmath>

#include "layers/accumulation_type.h"
#include "layers/blocked_attention.h"
#include "layers/functional.h"
#include "layers/fused_ops.h"
#include "layers/kernel_route.h"

namespace retort::layers {

Attention::Attention(const ModelConfig& c, const std::string& p, int64_t window,
                     ParameterStore& store, const TensorParallel& tp)
    : head_dim_(c.head_dim()), window_(window), norm_eps_(c.norm_eps) {
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
  place_adjacent({&*q_, &*k_, &*v_});  // the fused q|k|v product reads them in place
  if (c.qk_norm) {
    auto norm = [&](const char* name) {
      ParamSpec s;
      s.name = p + name;
      s.shape = {d};
      s.init = InitMethod::Ones;
      s.weight_decay = false;
      s.tp_partial_grad = true;  // each TP rank normalises its own heads with it
      return store.create(s);
    };
    q_norm_ = norm("q_norm.weight");
    k_norm_ = norm("k_norm.weight");
  }
}

std::pair<torch::Tensor, torch::Tensor> Attention::norm_heads(torch::Tensor q,
                                                              torch::Tensor k) const {
  if (!q_norm_.defined()) return {q, k};
  return {rms_norm(q, q_norm_, norm_eps_), rms_norm(k, k_norm_, norm_eps_)};
}

torch::Tensor Attention::forward(const torch::Tensor& x, const torch::Tensor& rope_cos,
                                 const torch::Tensor& rope_sin, const torch::Tensor& mask,
                                 const RecomputePolicy& recompute,
                                 const KernelPolicy& kernels) const {
  const int64_t b = x.size(0), s = x.size(1);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, s, -1, head_dim_}).transpose(1, 2);  // [b, local heads, s, d]
  };
  // One product by [W_q; W_k; W_v]; fused, q and k are rotated in place inside it.
  const int64_t q_width = q_->local_weight().size(0), kv_width = k_->local_weight().size(0);
  torch::Tensor qkv = packed_column_forward({&*q_, &*k_, &*v_}, x, kernels.run);
  torch::Tensor q, k, v;
  // The fused rotation works in place on the product; norms of queries and keys come before
  // the rotation, so a model with them rotates the normalised heads apart.
  if (fused_block_parts(kernels, x) && !q_norm_.defined()) {
    qkv = fused_rope_(qkv, rope_cos, rope_sin, (q_width + kv_width) / head_dim_);
    q = heads(qkv.narrow(-1, 0, q_width));
    k = heads(qkv.narrow(-1, q_width, kv_width));
  } else {
    std::tie(q, k) =
        norm_heads(heads(qkv.narrow(-1, 0, q_width)), heads(qkv.narrow(-1, q_width, kv_width)));
    q = apply_rope(q, rope_cos, rope_sin);
    k = apply_rope(k, rope_cos, rope_sin);
  }
  v = heads(qkv.narrow(-1, q_width + kv_width, kv_width));
  const int64_t block_rows = kernels.attention_block_rows, window = window_;
  // 16-bit tensors go to ATen's scaled-dot-product attention, whose kernel takes the softmax in
  // float32 (the blocked and dense cores here would take it in the tensors' type).
  const bool library = accumulation_type(x) != x.scalar_type();
  const kernels::KernelMode mode = kernels.mode();
  auto attend = [mask, block_rows, window, library, mode](const std::vector<torch::Tensor>& in) {
    if (library) return std::vector<torch::Tensor>{library_attention(in[0], in[1], in[2], window)};
    if (block_rows > 0)
      return std::vector<torch::Tensor>{
          blocked_attention(in[0], in[1], in[2], window, block_rows, kAttentionKeyBlock, mode)};
    return std::vector<torch::Tensor>{grouped_attention(in[0], in[1], in[2], mask)};
  };
  // Selective checkpointing keeps q, k, v and recomputes the core (for the dense core, the
  // b x h x s x s part; the blocked core keeps only its output and a log-sum-exp per row).
  torch::Tensor core = recompute.active(Checkpointing::selective)
                           ? run_recomputed(attend, {q, k, v}, recompute.offloader)[0]
                           : attend({q, k, v})[0];
  torch::Tensor out = core.transpose(1, 2).reshape({b, s, -1});
  return o_->forward(out, kernels.run);
}

torch::Tensor Attention::forward_cached(const torch::Tensor& x, const torch::Tensor& rope_cos,
                                        const torch::Tensor& rope_sin, const torch::Tensor& mask,
                                        torch::Tensor& keys, torch::Tensor& values,
                                        int64_t position, int64_t capacity, RunContext* run) const {
  const int64_t b = x.size(0), n = x.size(1);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, n, -1, head_dim_}).transpose(1, 2);  // [b, local heads, n, d]
  };
  auto [q, k] = norm_heads(heads(q_->forward(x, run)), heads(k_->forward(x, run)));
  q = apply_rope(q, rope_cos, rope_sin);
  k = apply_rope(k, rope_cos, rope_sin);
  torch::Tensor v = heads(v_->forward(x, run));
  if (!keys.defined()) {
    keys = torch::empty({b, k.size(1), capacity, head_dim_}, k.options());
    values = torch::empty_like(keys);
  }
  TORCH_CHECK(position + n <= keys.size(2), "KV cache full: ", position + n,
              " positions, room for ", keys.size(2));
  keys.narrow(2, position, n).copy_(k);
  values.narrow(2, position, n).copy_(v);
  torch::Tensor core = grouped_attention(q, keys.narrow(2, 0, position + n),
                                         values.narrow(2, 0, position + n), mask);
  return o_->forward(core.transpose(1, 2).reshape({b, n, -1}), run);
}

}  // namespace retort::layers
