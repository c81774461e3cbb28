// distill/teacher.cpp: see teacher.h.
#include "distill/teacher.h"

namespace retort::distill {

Teacher::Teacher(const layers::ModelConfig& config, uint64_t seed, torch::ScalarType dtype,
                 const layers::TensorParallel& tp)
    : store_(std::make_unique<layers::ParameterStore>(seed, dtype, tp.position())) {
  store_->set_lr_scale_rule([](const std::string&) { return 0.0; });  // frozen: no gradients
  model_ = std::make_unique<layers::LlamaModel>(config, *store_, tp);
}

torch::Tensor Teacher::forward(const torch::Tensor& tokens, layers::CaptureSink* sink) const {
  torch::NoGradGuard no_grad;
  return model_->forward(tokens, sink);
}

int64_t Teacher::weight_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : store_->all()) bytes += p.value.numel() * p.value.element_size();
  return bytes;
}

}  // namespace retort::distill
