// distill/teacher.cpp: see teacher.h.
#include "distill/teacher.h"

namespace retort::distill {

Teacher::Teacher(const layers::ModelConfig& config, uint64_t seed, torch::ScalarType dtype,
                 const layers::TensorParallel& tp, layers::ModelStage stage, torch::Device device)
    : store_(std::make_unique<layers::ParameterStore>(seed, dtype, tp.position(), device)) {
  store_->set_lr_scale_rule([](const std::string&) { return 0.0; });  // frozen: no gradients
  model_ = std::make_unique<layers::LlamaModel>(config, *store_, tp, stage);
}

torch::Tensor Teacher::forward(const torch::Tensor& tokens, layers::CaptureSink* sink) const {
  torch::NoGradGuard no_grad;
  return model_->forward(tokens, sink);
}

torch::Tensor Teacher::embed(const torch::Tensor& tokens) const {
  torch::NoGradGuard no_grad;
  return model_->embed(tokens);
}

torch::Tensor Teacher::run_blocks(const torch::Tensor& hidden, int64_t seq_len,
                                  layers::CaptureSink* sink) const {
  torch::NoGradGuard no_grad;
  return model_->run_blocks(hidden, seq_len, sink);
}

torch::Tensor Teacher::head_logits(const torch::Tensor& hidden) const {
  torch::NoGradGuard no_grad;
  return model_->head_logits(hidden);
}

HeadInput Teacher::head_input(const torch::Tensor& hidden) const {
  torch::NoGradGuard no_grad;
  return {model_->head_input(hidden), model_->head_weight()};
}

int64_t Teacher::weight_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : store_->all()) bytes += p.value.numel() * p.value.element_size();
  return bytes;
}

}  // namespace retort::distill
