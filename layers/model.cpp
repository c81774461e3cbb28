// layers/model.cpp: see model.h.
#include "layers/model.h"

#include "layers/accumulation_type.h"
#include "layers/compute_copy.h"
#include "layers/functional.h"
#include "layers/fused_ops.h"
#include "layers/kernel_route.h"
#include "layers/vocab_parallel.h"
#include "layers/widened_products.h"

namespace retort::layers {
namespace {
ParamSpec vocab_matrix_spec(const std::string& name, const ModelConfig& config, int64_t padded) {
  ParamSpec spec{name, {config.vocab_size, config.hidden}, 0};
  spec.init_std = config.init_std;
  spec.padded_rows = padded;
  return spec;
}
}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, ParameterStore& store, TensorParallel tp,
                       ModelStage stage)
    : config_(config), tp_(tp), stage_(stage), own_run_(std::make_unique<RunContext>()) {
  kernels_.run = own_run_.get();
  if (stage_.end_layer < 0) stage_.end_layer = config.layers;
  TORCH_CHECK(0 <= stage_.first_layer && stage_.first_layer <= stage_.end_layer &&
                  stage_.end_layer <= config.layers,
              "model stage layers out of range");
  const int64_t padded = padded_vocab_size(config, tp.size());
  if (stage_.embedding) embed_ = store.create(vocab_matrix_spec("embed.weight", config, padded));
  blocks_.reserve(stage_.end_layer - stage_.first_layer);
  for (int64_t i = stage_.first_layer; i < stage_.end_layer; ++i)
    blocks_.emplace_back(config, i, store, tp);
  if (!stage_.head) return;
  ParamSpec norm{"final_norm.weight", {config.hidden}, -1, true, InitMethod::Ones};
  norm.weight_decay = false;
  final_norm_ = store.create(norm);
  if (config.tied_embeddings && stage_.embedding) {
    lm_head_ = embed_;
    tied_head_sink_ = std::make_unique<TiedHeadGradientSink>(lm_head_);
    tied_head_sink_->set_gradient_offers(gradients_of(kernels_.run));
  } else if (config.tied_embeddings) {  // last pipeline stage: a copy of the first's
    ParamSpec copy = vocab_matrix_spec("embed.weight", config, padded);
    copy.tied_copy = true;
    lm_head_ = store.create(copy);
  } else {
    lm_head_ = store.create(vocab_matrix_spec("lm_head.weight", config, padded));
  }
}

void LlamaModel::set_kernels(const KernelPolicy& kernels) {
  kernels_ = kernels;
  if (!kernels_.run) kernels_.run = own_run_.get();
  if (tied_head_sink_) tied_head_sink_->set_gradient_offers(gradients_of(kernels_.run));
}

torch::Tensor LlamaModel::embed(const torch::Tensor& tokens) const {
  TORCH_CHECK(stage_.embedding, "embed() on a pipeline stage without the embedding");
  TORCH_CHECK(tokens.dim() == 2, "tokens must be [batch, seq]");
  // Tied on this stage: the head's dense gradient arrives first and the lookup's rows add in.
  const bool tied_here = config_.tied_embeddings && stage_.head;
  // The rows in the compute type, as every weight is used, then in the stream's type.
  torch::Tensor rows = vocab_parallel_embedding(tokens, embed_, tp_, /*sparse_grad=*/tied_here,
                                                compute_type_, tied_head_sink_.get());
  return residual_type_ ? rows.to(*residual_type_) : rows;
}

torch::Tensor LlamaModel::run_blocks(torch::Tensor x, int64_t seq_len, CaptureSink* sink) const {
  if (blocks_.empty()) return x;
  BlockContext context = make_block_context(config_, seq_len, x.options(), kernels_);
  context.recompute = recompute_;
  if (compute_type_ != residual_type_) context.compute_type = compute_type_;
  if (recompute_.offloader) recompute_.offloader->begin_chain();
  for (const Block& block : blocks_) x = block.forward(x, context, sink);
  return x;
}

torch::Tensor LlamaModel::head_input(const torch::Tensor& hidden) const {
  TORCH_CHECK(stage_.head, "the LM head runs on the last pipeline stage only");
  // As the blocks' norms (block.cpp): the result in the products' type.
  return tp_.enter_column(
      stream_rms_norm(kernels_, hidden, final_norm_, compute_type_, config_.norm_eps));
}

torch::Tensor LlamaModel::unmasked_logits(const torch::Tensor& hidden) const {
  const torch::Tensor input = head_input(hidden);
  return matmul_widening(input, in_type_of(lm_head_, input).t());
}

torch::Tensor LlamaModel::head_logits(const torch::Tensor& hidden) const {
  return mask_padded_logits(unmasked_logits(hidden), config_.vocab_size, tp_);
}

torch::Tensor LlamaModel::head_loss_sum(const torch::Tensor& hidden, const torch::Tensor& targets,
                                        HeadGradSink* weight_grad_sink) const {
  if (head_chunk_tokens_ <= 0)
    return vocab_parallel_cross_entropy(unmasked_logits(hidden), targets, config_.vocab_size, tp_)
        .sum();
  return fused_head_cross_entropy_sum(head_input(hidden), lm_head_, targets, config_.vocab_size,
                                      tp_, head_chunk_tokens_, weight_grad_sink, kernels_);
}

torch::Tensor LlamaModel::forward(const torch::Tensor& tokens, CaptureSink* sink) const {
  return head_logits(run_blocks(embed(tokens), tokens.size(1), sink));
}

torch::Tensor LlamaModel::loss_sum(const torch::Tensor& tokens, const torch::Tensor& targets,
                                   CaptureSink* sink) const {
  return head_loss_sum(run_blocks(embed(tokens), tokens.size(1), sink), targets);
}

torch::Tensor LlamaModel::forward_cached(const torch::Tensor& tokens, KvCache& cache) const {
  TORCH_CHECK(stage_.embedding && stage_.head, "forward_cached needs the whole model");
  TORCH_CHECK(!tp_.sequence_parallel, "forward_cached runs without sequence parallelism");
  const int64_t n = tokens.size(1), position = cache.length;
  TORCH_CHECK(cache.capacity >= position + n, "KV cache of ", cache.capacity,
              " positions cannot take ", position + n);
  if (cache.keys.empty()) {
    cache.keys.resize(blocks_.size());
    cache.values.resize(blocks_.size());
  }
  torch::Tensor x = embed(tokens);
  BlockContext context;
  context.kernels.attention_block_rows = 0;  // dense masks over the cached positions
  context.kernels.run = kernels_.run;
  std::tie(context.rope_cos, context.rope_sin) =
      rope_tables(n, rope_frequencies(config_), position, x.options().dtype(accumulation_type(x)));
  context.mask_full = attention_mask(n, position + n, position, 0, x.options());
  for (int64_t layer = 0; layer < config_.layers; ++layer) {
    const int64_t w = config_.window_of_layer(layer);
    if (w > 0 && !context.mask_by_window.count(w))
      context.mask_by_window[w] = attention_mask(n, position + n, position, w, x.options());
  }
  for (const Block& block : blocks_) x = block.forward_cached(x, context, cache, position);
  cache.length = position + n;
  torch::Tensor normed = rms_norm(x, final_norm_, config_.norm_eps);
  return mask_padded_logits(
      matmul_widening(tp_.enter_column(normed), in_type_of(lm_head_, normed).t()),
      config_.vocab_size, tp_);
}

int64_t count_targets(const torch::Tensor& targets) {
  return targets.ne(kIgnoreIndex).sum().item<int64_t>();
}

}  // namespace retort::layers
