// distill/teacher.h: the frozen teacher: its own parameter store (no gradients, no
// optimizer) and model, in the student's parallel layout, run forward without autograd on
// the student's micro-batch. Weights come from a checkpoint loaded by the caller into
// parameters(), or from (seed, name) initialisation.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "layers/model.h"

namespace retort::distill {

class Teacher {
 public:
  Teacher(const layers::ModelConfig& config, uint64_t seed, torch::ScalarType dtype,
          const layers::TensorParallel& tp);
  // Masked local logits [b, s, padded_vocab / tp]; records the wanted capture points.
  torch::Tensor forward(const torch::Tensor& tokens, layers::CaptureSink* sink) const;
  layers::ParameterStore& parameters() { return *store_; }
  const layers::ModelConfig& config() const { return model_->config(); }
  int64_t weight_bytes() const;

 private:
  std::unique_ptr<layers::ParameterStore> store_;
  std::unique_ptr<layers::LlamaModel> model_;
};

}  // namespace retort::distill
