// distill/logit_losses.h: logit distillation between a student and a teacher whose logits
// are split over the TP group along the (padded) vocabulary, never gathered:
//   forward_kl  = sum_v p_t (log p_t - log p_s)     (KL(teacher || student))
//   reverse_kl  = sum_v p_s (log p_s - log p_t)     (KL(student || teacher))
//   soft_ce     = -sum_v p_t log p_s                (soft cross-entropy)
// with p = softmax(logits / T). Per-token values are summed over tokens whose weight is 1
// (masked tokens have 0); optionally scaled by T^2 (Hinton). The log-sum-exps are reduced
// over TP once in forward; backward recomputes the probabilities chunk by chunk from the
// saved logits, so extra memory stays at one chunk of tokens.
#pragma once
#include <torch/torch.h>

#include <string>

#include "distill/distill_config.h"
#include "layers/head_grad_sink.h"
#include "layers/tensor_parallel.h"

namespace retort::distill {

// student, teacher: [..., local_vocab]; weight: [...] of 0/1 (which tokens count).
// Returns the weighted sum over tokens (a scalar, identical on every TP rank).
torch::Tensor logit_distillation_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                                     const torch::Tensor& weight, int64_t vocab_size,
                                     const LogitLossOptions& options,
                                     const layers::TensorParallel& tp);

// The same logit loss and, computed alongside on the same student logits, the LM
// cross-entropy against hard targets ([...], kIgnoreIndex where weight is 0): {kd, ce}. The
// fused form keeps no softmax for the cross-entropy's backward, so distillation adds only the
// teacher's logits to the memory of an LM-only step.
std::pair<torch::Tensor, torch::Tensor> logit_distillation_and_lm_sums(
    const torch::Tensor& student, const torch::Tensor& teacher, const torch::Tensor& weight,
    const torch::Tensor& targets, int64_t vocab_size, const LogitLossOptions& options,
    const layers::TensorParallel& tp);

// An LM head as the logit loss sees it: logits = input @ weight^T over this rank's (padded)
// vocabulary slice. input [..., h] is the head's input after the final norm (and
// enter_column), weight [local_vocab, h].
// weight_grad_sink (the student's, optional; optimizer-in-backward): the weight's gradient
// goes there in blocks of rows, formed in backward, instead of to autograd. The recomputing
// form (logit_distillation_and_lm_sums_from_heads) and the fused LM head take one; the
// total form, which forms the gradient in forward, refuses it.
struct HeadInput {
  torch::Tensor input, weight;
  layers::HeadGradSink* weight_grad_sink = nullptr;
};

// The same {kd, ce} with both heads fused in: a chunk's logits are computed from the head
// inputs in forward and again in backward, and never kept; gradients reach the student head's
// input and weight. Under activation checkpointing this keeps [tokens, h] instead of
// [tokens, vocab] (the price: both heads' logits computed twice).
std::pair<torch::Tensor, torch::Tensor> logit_distillation_and_lm_sums_from_heads(
    const HeadInput& student, const HeadInput& teacher, const torch::Tensor& weight,
    const torch::Tensor& targets, int64_t vocab_size, const LogitLossOptions& options,
    const layers::TensorParallel& tp);

// The weighted total kd_factor * kd + ce_factor * ce with both heads fused in and its
// gradient formed in forward, chunk by chunk (no [tokens, vocab] tensor exists beyond one
// chunk, none is kept, none recomputed); backward scales the gradient of the student head's
// input and weight. kd and ce come back as plain values, for logging.
struct FusedLogitLoss {
  torch::Tensor total, kd_sum, ce_sum;
};
FusedLogitLoss logit_distillation_total_from_heads(
    const HeadInput& student, const HeadInput& teacher, const torch::Tensor& weight,
    const torch::Tensor& targets, int64_t vocab_size, const LogitLossOptions& options,
    const layers::TensorParallel& tp, double kd_factor, double ce_factor);

}  // namespace retort::distill
