// layers/block.cpp: see block.h.
#include "layers/block.h"

#include "layers/accumulation_type.h"
#include "layers/functional.h"
#include "layers/fused_ops.h"
#include "layers/kernel_route.h"

namespace retort::layers {
namespace {

ParamSpec norm_spec(const std::string& name, int64_t size) {
  ParamSpec s;
  s.name = name;
  s.shape = {size};
  s.init = InitMethod::Ones;
  s.weight_decay = false;
  s.sequence_replicated = true;  // under STP each rank sees part of the sequence
  return s;
}

}  // namespace

const torch::Tensor& BlockContext::mask_for(int64_t window) const {
  static const torch::Tensor no_mask;  // blocked attention masks each block itself
  if (kernels.attention_block_rows > 0) return no_mask;
  if (window <= 0) return mask_full;
  return mask_by_window.at(window);
}

BlockContext make_block_context(const ModelConfig& config, int64_t seq_len,
                                torch::TensorOptions options, const KernelPolicy& kernels) {
  BlockContext c;
  c.kernels = kernels;
  // The tables in float32 for 16-bit activations (apply_rope rotates in the tables' type).
  const torch::TensorOptions table_options =
      options.dtype(accumulation_type(torch::typeMetaToScalarType(options.dtype())));
  std::tie(c.rope_cos, c.rope_sin) =
      rope_tables(seq_len, rope_frequencies(config), 0, table_options);
  if (kernels.attention_block_rows > 0) return c;  // the blocked attention masks per block
  c.mask_full = attention_mask(seq_len, seq_len, 0, 0, options);
  for (int64_t layer = 0; layer < config.layers; ++layer) {
    const int64_t w = config.window_of_layer(layer);
    if (w > 0 && !c.mask_by_window.count(w))
      c.mask_by_window[w] = attention_mask(seq_len, seq_len, 0, w, options);
  }
  return c;
}

Block::Block(const ModelConfig& config, int64_t index, ParameterStore& store, TensorParallel tp)
    : norm_eps_(config.norm_eps),
      tp_(tp),
      index_(index),
      attn_norm_(store.create(norm_spec(capture_name(index, "attn_norm.weight"), config.hidden))),
      mlp_norm_(store.create(norm_spec(capture_name(index, "mlp_norm.weight"), config.hidden))),
      attention_(config, capture_name(index, "attn."), config.window_of_layer(index), store, tp),
      mlp_(config, capture_name(index, "mlp."), store, tp) {}

torch::Tensor Block::forward(const torch::Tensor& x, const BlockContext& context,
                             CaptureSink* sink) const {
  if (!context.recompute.active(Checkpointing::full)) return forward_parts(x, context, sink);
  std::vector<std::string> captured;
  for (const char* point : kCapturePoints)
    if (sink && sink->wants(capture_name(index_, point)))
      captured.push_back(capture_name(index_, point));
  BlockContext plain = context;  // the recomputation itself keeps everything it needs
  plain.recompute = {};
  auto block = [this, plain, captured](const std::vector<torch::Tensor>& in) {
    CaptureSink local({captured.begin(), captured.end()});
    std::vector<torch::Tensor> out{forward_parts(in[0], plain, &local)};
    for (const std::string& name : captured) out.push_back(local.at(name));
    return out;
  };
  std::vector<torch::Tensor> out = run_recomputed(block, {x}, context.recompute.offloader);
  for (size_t i = 0; i < captured.size(); ++i) sink->put(captured[i], out[1 + i]);
  return out[0];
}

torch::Tensor Block::forward_parts(const torch::Tensor& x, const BlockContext& context,
                                   CaptureSink* sink) const {
  auto norm = [&](const torch::Tensor& in, const torch::Tensor& weight) {
    return stream_rms_norm(context.kernels, in, weight, context.compute_type, norm_eps_);
  };
  torch::Tensor mixer =
      attention_.forward(tp_.enter_column(norm(x, attn_norm_)), context.rope_cos, context.rope_sin,
                         context.mask_for(attention_.window()), context.recompute, context.kernels);
  torch::Tensor h = x + mixer;
  torch::Tensor mlp =
      mlp_.forward(tp_.enter_column(norm(h, mlp_norm_)), context.recompute, context.kernels);
  torch::Tensor out = h + mlp;
  if (sink) {
    sink->put(capture_name(index_, "mixer_output"), mixer);
    sink->put(capture_name(index_, "mlp_output"), mlp);
    sink->put(capture_name(index_, "block_output"), out);
  }
  return out;
}

torch::Tensor Block::forward_cached(const torch::Tensor& x, const BlockContext& context,
                                    KvCache& cache, int64_t position) const {
  torch::Tensor mixer = attention_.forward_cached(
      tp_.enter_column(rms_norm(x, attn_norm_, norm_eps_)), context.rope_cos, context.rope_sin,
      context.mask_for(attention_.window()), cache.keys[size_t(index_)],
      cache.values[size_t(index_)], position, cache.capacity, context.kernels.run);
  torch::Tensor h = x + mixer;
  return h + mlp_.forward(tp_.enter_column(rms_norm(h, mlp_norm_, norm_eps_)), {}, context.kernels);
}

}  // namespace retort::layers
