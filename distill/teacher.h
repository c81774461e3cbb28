// distill/teacher.h: the frozen teacher: its own parameter store (no gradients, no
// optimizer) and model, in the student's parallel layout, run forward without autograd on
// the student's micro-batch. Weights come from a checkpoint loaded by the caller into
// parameters(), or from (seed, name) initialisation. Under pipeline parallelism it holds the
// teacher layers of this stage, and its hidden state travels the pipeline next to the
// student's (embed on the first stage, run_blocks on each, head_logits on the last).
#pragma once
#include <torch/torch.h>

#include <memory>

#include "distill/logit_losses.h"
#include "layers/model.h"

namespace retort::distill {

class Teacher {
 public:
  Teacher(const layers::ModelConfig& config, uint64_t seed, torch::ScalarType dtype,
          const layers::TensorParallel& tp, layers::ModelStage stage = {},
          torch::Device device = torch::kCPU);
  // Whole teacher: masked local logits [b, s, padded_vocab / tp]; records the wanted
  // capture points.
  torch::Tensor forward(const torch::Tensor& tokens, layers::CaptureSink* sink) const;
  // The pieces of one pipeline stage, all without autograd.
  torch::Tensor embed(const torch::Tensor& tokens) const;
  torch::Tensor run_blocks(const torch::Tensor& hidden, int64_t seq_len,
                           layers::CaptureSink* sink) const;
  torch::Tensor head_logits(const torch::Tensor& hidden) const;
  // The head's input and weight, for losses that fuse the head in (logit_losses.h).
  HeadInput head_input(const torch::Tensor& hidden) const;

  layers::ParameterStore& parameters() { return *store_; }
  const layers::ModelConfig& config() const { return model_->config(); }
  const layers::LlamaModel& model() const { return *model_; }
  // The residual stream's type, when set apart from the weights' (layers::LlamaModel::set_types).
  void set_residual_type(torch::ScalarType type) { model_->set_types(store_->dtype(), type); }
  // The run it belongs to (layers/run_context.h: kernel mode, compute copies), the student's;
  // its blocks keep the default fused, blocked policy whatever the student's memory keys.
  void set_run(layers::RunContext* run) {
    layers::KernelPolicy kernels = model_->kernels();
    kernels.run = run;
    model_->set_kernels(kernels);
  }
  int64_t weight_bytes() const;

 private:
  std::unique_ptr<layers::ParameterStore> store_;
  std::unique_ptr<layers::LlamaModel> model_;
};

}  // namespace retort::distill
