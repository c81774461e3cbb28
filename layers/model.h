// layers/model.h: the Llama-family decoder: token embedding, blocks, final RMSNorm and LM
// head (tied to the embedding or not), plus the summed cross-entropy the trainer normalises
// by the global number of target tokens. Under tensor parallelism the vocabulary (padded to
// a multiple of TP x 128) is split over ranks and logits stay split; under sequence
// parallelism the residual stream is split along the sequence between embedding and head.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "layers/block.h"
#include "layers/capture.h"
#include "layers/model_config.h"
#include "layers/parameters.h"
#include "layers/tensor_parallel.h"

namespace retort::layers {

inline constexpr int64_t kIgnoreIndex = -100;

class LlamaModel {
 public:
  LlamaModel(const ModelConfig& config, ParameterStore& store, TensorParallel tp = {});

  // tokens [batch, seq] (int64, the full sequence on every TP rank) -> this rank's logits
  // [batch, seq, padded_vocab / tp]; padded vocabulary entries are -inf.
  torch::Tensor forward(const torch::Tensor& tokens, CaptureSink* sink = nullptr) const;
  // Sum over target tokens (targets != kIgnoreIndex) of the cross-entropy; the same value on
  // every TP rank.
  torch::Tensor loss_sum(const torch::Tensor& tokens, const torch::Tensor& targets,
                         CaptureSink* sink = nullptr) const;

  const ModelConfig& config() const { return config_; }
  const TensorParallel& tensor_parallel() const { return tp_; }

 private:
  torch::Tensor local_logits(const torch::Tensor& tokens, CaptureSink* sink) const;

  ModelConfig config_;
  TensorParallel tp_;
  torch::Tensor embed_, final_norm_, lm_head_;
  std::vector<Block> blocks_;
};

// Number of targets that count in the loss.
int64_t count_targets(const torch::Tensor& targets);

}  // namespace retort::layers
