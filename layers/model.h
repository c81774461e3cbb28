// layers/model.h: the Llama-family decoder: token embedding, blocks, final RMSNorm and LM
// head (tied to the embedding or not), plus the summed cross-entropy the trainer normalises
// by the global number of target tokens.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "layers/block.h"
#include "layers/capture.h"
#include "layers/model_config.h"
#include "layers/parameters.h"

namespace retort::layers {

inline constexpr int64_t kIgnoreIndex = -100;

class LlamaModel {
 public:
  LlamaModel(const ModelConfig& config, ParameterStore& store);

  // tokens [batch, seq] (int64) -> logits [batch, seq, vocab]
  torch::Tensor forward(const torch::Tensor& tokens, CaptureSink* sink = nullptr) const;
  // Sum over target tokens (targets != kIgnoreIndex) of the cross-entropy.
  torch::Tensor loss_sum(const torch::Tensor& tokens, const torch::Tensor& targets,
                         CaptureSink* sink = nullptr) const;

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  torch::Tensor embed_, final_norm_, lm_head_;
  std::vector<Block> blocks_;
};

// Sum of cross-entropy over targets != kIgnoreIndex; logits [..., vocab], targets [...].
torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets);
// Number of targets that count in the loss.
int64_t count_targets(const torch::Tensor& targets);

}  // namespace retort::layers
