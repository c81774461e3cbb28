// layers/model.cpp: see model.h.
#include "layers/model.h"

#include "layers/functional.h"

namespace retort::layers {

LlamaModel::LlamaModel(const ModelConfig& config, ParameterStore& store) : config_(config) {
  ParamSpec embed{"embed.weight", {config.vocab_size, config.hidden}, 0};
  embed.init_std = config.init_std;
  embed_ = store.create(embed);
  blocks_.reserve(config.layers);
  for (int64_t i = 0; i < config.layers; ++i) blocks_.emplace_back(config, i, store);
  ParamSpec norm{"final_norm.weight", {config.hidden}, -1, true, InitMethod::Ones};
  norm.weight_decay = false;
  final_norm_ = store.create(norm);
  if (config.tied_embeddings) {
    lm_head_ = embed_;
  } else {
    ParamSpec head{"lm_head.weight", {config.vocab_size, config.hidden}, 0};
    head.init_std = config.init_std;
    lm_head_ = store.create(head);
  }
}

torch::Tensor LlamaModel::forward(const torch::Tensor& tokens, CaptureSink* sink) const {
  TORCH_CHECK(tokens.dim() == 2, "tokens must be [batch, seq]");
  torch::Tensor x = torch::embedding(embed_, tokens);
  BlockContext context = make_block_context(config_, tokens.size(1), x.options());
  for (const Block& block : blocks_) x = block.forward(x, context, sink);
  x = rms_norm(x, final_norm_, config_.norm_eps);
  return torch::matmul(x, lm_head_.t());
}

torch::Tensor LlamaModel::loss_sum(const torch::Tensor& tokens, const torch::Tensor& targets,
                                   CaptureSink* sink) const {
  return cross_entropy_sum(forward(tokens, sink), targets);
}

torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets) {
  namespace F = torch::nn::functional;
  const int64_t vocab = logits.size(-1);
  return F::cross_entropy(logits.reshape({-1, vocab}), targets.reshape({-1}),
                          F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(
                              kIgnoreIndex));
}

int64_t count_targets(const torch::Tensor& targets) {
  return targets.ne(kIgnoreIndex).sum().item<int64_t>();
}

}  // namespace retort::layers
