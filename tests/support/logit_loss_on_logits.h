// tests/support/logit_loss_on_logits.h: the production logit loss
// (distill::logit_distillation_from_heads) on logits a test already holds. Each head's input
// is the logits themselves and its weight the identity, so the loss forms logits @ I^T, which
// is the logits exactly (products with 1 and 0), and d/d(input) is d/d(logits) exactly. Under
// TP each rank passes its vocabulary slice [..., local] as input, and the identity is
// [local, local].
#pragma once
#include <torch/torch.h>

#include "distill/logit_losses.h"

namespace retort::testing {

inline distill::LogitLossValue logit_loss_on_logits(
    const torch::Tensor& student, const torch::Tensor& teacher, const torch::Tensor& weight,
    const torch::Tensor& targets, int64_t vocab_size, const distill::LogitLossOptions& options,
    const layers::TensorParallel& tp, const distill::LossFactors& factors,
    distill::HeadLogits head_logits = distill::HeadLogits::formed_again_in_backward) {
  const torch::Tensor identity = torch::eye(student.size(-1), torch::dtype(student.scalar_type()));
  return distill::logit_distillation_from_heads({student, identity}, {teacher, identity}, weight,
                                                targets, vocab_size, options, tp, factors,
                                                head_logits);
}

}  // namespace retort::testing
