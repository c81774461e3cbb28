// layers/model.cpp: see model.h.
#include "layers/model.h"

#include "layers/functional.h"
#include "layers/vocab_parallel.h"

namespace retort::layers {

LlamaModel::LlamaModel(const ModelConfig& config, ParameterStore& store, TensorParallel tp)
    : config_(config), tp_(tp) {
  const int64_t padded = padded_vocab_size(config.vocab_size, tp.size());
  ParamSpec embed{"embed.weight", {config.vocab_size, config.hidden}, 0};
  embed.init_std = config.init_std;
  embed.padded_rows = padded;
  embed_ = store.create(embed);
  blocks_.reserve(config.layers);
  for (int64_t i = 0; i < config.layers; ++i) blocks_.emplace_back(config, i, store, tp);
  ParamSpec norm{"final_norm.weight", {config.hidden}, -1, true, InitMethod::Ones};
  norm.weight_decay = false;
  final_norm_ = store.create(norm);
  if (config.tied_embeddings) {
    lm_head_ = embed_;
  } else {
    ParamSpec head{"lm_head.weight", {config.vocab_size, config.hidden}, 0};
    head.init_std = config.init_std;
    head.padded_rows = padded;
    lm_head_ = store.create(head);
  }
}

torch::Tensor LlamaModel::local_logits(const torch::Tensor& tokens, CaptureSink* sink) const {
  TORCH_CHECK(tokens.dim() == 2, "tokens must be [batch, seq]");
  torch::Tensor x = vocab_parallel_embedding(tokens, embed_, tp_);
  BlockContext context = make_block_context(config_, tokens.size(1), x.options());
  for (const Block& block : blocks_) x = block.forward(x, context, sink);
  x = tp_.enter_column(rms_norm(x, final_norm_, config_.norm_eps));
  return torch::matmul(x, lm_head_.t());
}

torch::Tensor LlamaModel::forward(const torch::Tensor& tokens, CaptureSink* sink) const {
  return mask_padded_logits(local_logits(tokens, sink), config_.vocab_size, tp_);
}

torch::Tensor LlamaModel::loss_sum(const torch::Tensor& tokens, const torch::Tensor& targets,
                                   CaptureSink* sink) const {
  return vocab_parallel_cross_entropy(local_logits(tokens, sink), targets, config_.vocab_size, tp_)
      .sum();
}

int64_t count_targets(const torch::Tensor& targets) {
  return targets.ne(kIgnoreIndex).sum().item<int64_t>();
}

}  // namespace retort::layers
