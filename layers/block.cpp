// layers/block.cpp: see block.h.
#include "layers/block.h"

#include <cmath>

#include "layers/functional.h"

namespace retort::layers {
namespace {

ParamSpec matrix(const std::string& name, int64_t out, int64_t in, int shard_dim, double std) {
  ParamSpec s;
  s.name = name;
  s.shape = {out, in};
  s.shard_dim = shard_dim;
  s.init_std = std;
  return s;
}

ParamSpec vector_param(const std::string& name, int64_t size, InitMethod init, int shard_dim) {
  ParamSpec s;
  s.name = name;
  s.shape = {size};
  s.init = init;
  s.shard_dim = shard_dim;
  s.weight_decay = false;
  s.sequence_replicated = shard_dim < 0;
  return s;
}

}  // namespace

const torch::Tensor& BlockContext::mask_for(int64_t window) const {
  if (window <= 0) return mask_full;
  return mask_by_window.at(window);
}

BlockContext make_block_context(const ModelConfig& config, int64_t seq_len,
                                torch::TensorOptions options) {
  BlockContext c;
  std::tie(c.rope_cos, c.rope_sin) =
      rope_tables(seq_len, config.head_dim(), config.rope_theta, 0, options);
  c.mask_full = attention_mask(seq_len, seq_len, 0, 0, options);
  for (int64_t layer = 0; layer < config.layers; ++layer) {
    const int64_t w = config.window_of_layer(layer);
    if (w > 0 && !c.mask_by_window.count(w))
      c.mask_by_window[w] = attention_mask(seq_len, seq_len, 0, w, options);
  }
  return c;
}

Block::Block(const ModelConfig& config, int64_t index, ParameterStore& store, TensorParallel tp)
    : config_(config), tp_(tp), index_(index), window_(config.window_of_layer(index)) {
  const std::string p = "layers." + std::to_string(index) + ".";
  const int64_t h = config.hidden, d = config.head_dim();
  const int64_t q_out = config.heads * d, kv_out = config.kv_heads * d;
  const double std = config.init_std;
  // Output projections feed the residual stream: scaled as in Megatron (std / sqrt(2L)).
  const double out_std = std / std::sqrt(2.0 * config.layers);
  // Fewer kv heads than TP ranks: keep k/v whole and use the rows of this rank's kv head.
  const bool kv_replicated = config.kv_heads % tp.size() != 0;
  const int kv_shard = kv_replicated ? -1 : 0;
  if (kv_replicated) {
    const int64_t heads_per_rank = config.heads / tp.size();
    const int64_t group = config.heads / config.kv_heads;
    kv_row_offset_ = (tp.rank() * heads_per_rank / group) * d;
    kv_rows_ = d;
  }
  auto kv_spec = [&](ParamSpec s) {
    s.tp_partial_grad = kv_replicated;
    return s;
  };
  attn_norm_ = store.create(vector_param(p + "attn_norm.weight", h, InitMethod::Ones, -1));
  q_proj_ = store.create(matrix(p + "attn.q_proj.weight", q_out, h, 0, std));
  k_proj_ = store.create(kv_spec(matrix(p + "attn.k_proj.weight", kv_out, h, kv_shard, std)));
  v_proj_ = store.create(kv_spec(matrix(p + "attn.v_proj.weight", kv_out, h, kv_shard, std)));
  if (config.qkv_bias) {
    q_bias_ = store.create(vector_param(p + "attn.q_proj.bias", q_out, InitMethod::Zeros, 0));
    k_bias_ = store.create(
        kv_spec(vector_param(p + "attn.k_proj.bias", kv_out, InitMethod::Zeros, kv_shard)));
    v_bias_ = store.create(
        kv_spec(vector_param(p + "attn.v_proj.bias", kv_out, InitMethod::Zeros, kv_shard)));
  }
  o_proj_ = store.create(matrix(p + "attn.o_proj.weight", h, q_out, 1, out_std));
  mlp_norm_ = store.create(vector_param(p + "mlp_norm.weight", h, InitMethod::Ones, -1));
  gate_proj_ = store.create(matrix(p + "mlp.gate_proj.weight", config.ffn_hidden, h, 0, std));
  up_proj_ = store.create(matrix(p + "mlp.up_proj.weight", config.ffn_hidden, h, 0, std));
  down_proj_ = store.create(matrix(p + "mlp.down_proj.weight", h, config.ffn_hidden, 1, out_std));
}

torch::Tensor Block::attention(const torch::Tensor& x, const BlockContext& context) const {
  // x: this rank's column-parallel input, full sequence [b, s, h].
  const int64_t b = x.size(0), s = x.size(1), d = config_.head_dim();
  torch::Tensor flat = x.reshape({b * s, -1});
  auto project = [&](torch::Tensor w, torch::Tensor bias, bool kv) {
    if (kv && kv_rows_ > 0) {
      w = w.narrow(0, kv_row_offset_, kv_rows_);
      if (bias.defined()) bias = bias.narrow(0, kv_row_offset_, kv_rows_);
    }
    torch::Tensor y = bias.defined() ? torch::addmm(bias, flat, w.t()) : torch::matmul(flat, w.t());
    return y.view({b, s, -1, d}).transpose(1, 2);  // [b, local heads, s, d]
  };
  torch::Tensor q =
      apply_rope(project(q_proj_, q_bias_, false), context.rope_cos, context.rope_sin);
  torch::Tensor k = apply_rope(project(k_proj_, k_bias_, true), context.rope_cos, context.rope_sin);
  torch::Tensor v = project(v_proj_, v_bias_, true);
  torch::Tensor out = grouped_attention(q, k, v, context.mask_for(window_));
  out = out.transpose(1, 2).reshape({b, s, -1});
  return tp_.exit_row(torch::matmul(out, o_proj_.t()));
}

torch::Tensor Block::forward(const torch::Tensor& x, const BlockContext& context,
                             CaptureSink* sink) const {
  torch::Tensor mixer =
      attention(tp_.enter_column(rms_norm(x, attn_norm_, config_.norm_eps)), context);
  torch::Tensor h = x + mixer;
  torch::Tensor mlp_in = tp_.enter_column(rms_norm(h, mlp_norm_, config_.norm_eps));
  torch::Tensor mlp = tp_.exit_row(swiglu(mlp_in, gate_proj_, up_proj_, down_proj_));
  torch::Tensor out = h + mlp;
  if (sink) {
    sink->put(capture_name(index_, "mixer_output"), mixer);
    sink->put(capture_name(index_, "mlp_output"), mlp);
    sink->put(capture_name(index_, "block_output"), out);
  }
  return out;
}

}  // namespace retort::layers
