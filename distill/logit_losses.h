// distill/logit_losses.h: logit distillation between a student and a teacher whose logits
// are split over the TP group along the (padded) vocabulary, never gathered:
//   forward_kl  = sum_v p_t (log p_t - log p_s)     (KL(teacher || student))
//   reverse_kl  = sum_v p_s (log p_s - log p_t)     (KL(student || teacher))
//   soft_ce     = -sum_v p_t log p_s                (soft cross-entropy)
// with p = softmax(logits / T), the logits formed from the heads' inputs chunk of tokens by
// chunk. Per-token values are summed over tokens whose weight is 1 (masked tokens have 0);
// optionally scaled by T^2 (Hinton). The log-sum-exps are reduced over TP once per chunk.
// One entry point; tests that start from logits give it identity heads
// (tests/support/logit_loss_on_logits.h).
#pragma once
#include <torch/torch.h>

#include <string>

#include "distill/distill_config.h"
#include "layers/head_grad_sink.h"
#include "layers/run_context.h"
#include "layers/tensor_parallel.h"

namespace retort::distill {

// An LM head as the logit loss sees it: logits = input @ weight^T over this rank's (padded)
// vocabulary slice. input [..., h] is the head's input after the final norm (and
// enter_column), weight [local_vocab, h].
// weight_grad_sink (the student's, optional; optimizer-in-backward): the weight's gradient
// goes there instead of to autograd, whole or in blocks of rows formed in backward
// (layers/head_grad_sink.h).
struct HeadInput {
  torch::Tensor input, weight;
  layers::HeadGradSink* weight_grad_sink = nullptr;
};

// How the loss's total is weighted: kd * logit loss sum + ce * LM cross-entropy sum.
struct LossFactors {
  double kd = 1, ce = 0;
};

// When the student's and teacher's logits are formed. Either way no [tokens, vocab] tensor
// outlives a chunk of tokens.
enum class HeadLogits {
  // Once, in forward, which forms the gradient of the student head's input and weight chunk
  // by chunk; backward only scales it. The default: one pass over the logits.
  gradient_in_forward,
  // In forward for the loss and again in backward for the gradient, so only the head inputs
  // are kept (activation checkpointing). Taken whatever is asked when the student's sink
  // streams rows (optimizer-in-backward).
  formed_again_in_backward,
};

// The weighted total (differentiable) and its two sums (plain values, for logging).
struct LogitLossValue {
  torch::Tensor total, kd_sum, ce_sum;
};

// The logit loss with both heads fused in, and alongside it on the same student logits the
// LM cross-entropy against hard targets ([...], kIgnoreIndex where weight is 0; undefined:
// none). weight: [...] of 0/1 (which tokens count). The sums run over the tokens whose weight
// is 1 and are identical on every TP rank; the gradients reach the student head's input (this
// rank's part, summed over TP by the caller's enter_column) and weight. `run`: the run the heads
// belong to (layers/run_context.h: kernel mode, compute copies, gradient memory; null: none).
LogitLossValue logit_distillation_from_heads(const HeadInput& student, const HeadInput& teacher,
                                             const torch::Tensor& weight,
                                             const torch::Tensor& targets, int64_t vocab_size,
                                             const LogitLossOptions& options,
                                             const layers::TensorParallel& tp,
                                             const LossFactors& factors, HeadLogits head_logits,
                                             layers::RunContext* run = nullptr);

}  // namespace retort::distill
