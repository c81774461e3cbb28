// distill/activation_losses.h: activation distillation between a student and a teacher
// capture point ([batch, seq, hidden], sequence-split under STP, replicated under TP):
//   mse    = mean over hidden of (s - t)^2, per token
//   cosine = 1 - cos(s, t), per token
//   l2     = ||s - t||_2 over hidden, per token (Fast-LLM's activation loss)
// summed over the tokens whose weight is 1. Under sequence parallel each rank holds other
// tokens, so the partial sums are added over TP (reduce_from_tp: the value is then the same
// everywhere and each rank's gradient stays its own tokens').
#pragma once
#include <torch/torch.h>

#include <string>

#include "distill/distill_config.h"
#include "layers/tensor_parallel.h"

namespace retort::distill {

// weight: [batch, seq_local] of 0/1 matching the activations' tokens.
torch::Tensor activation_distillation_sum(const torch::Tensor& student,
                                          const torch::Tensor& teacher, const torch::Tensor& weight,
                                          ActivationLoss kind, const layers::TensorParallel& tp);

}  // namespace retort::distill
