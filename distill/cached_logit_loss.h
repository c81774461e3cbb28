// distill/cached_logit_loss.h: the logit loss against a teacher known only by its k most likely
// tokens per position (a teacher cache's entries, engine/teacher_cache), with the student's head
// fused in and its vocabulary split over the TP group, never gathered. With p the teacher's
// cached probabilities, q = softmax(student logits / T), K the cached ids:
//   renormalise: the k cached probabilities renormalised to sum to one (what
//                distill.teacher_top_k does online); forward_kl = sum_K p (log p - log q),
//                soft_ce = -sum_K p log q.
//   ghost:       the k probabilities as cached (normalised over the whole vocabulary) and the
//                tail m = 1 - sum_K p as one more class against the student's own tail
//                q_tail = sum_{v not in K} q_v: forward_kl adds m (log m - log q_tail),
//                soft_ce adds -m log q_tail.
// The gradient with respect to the student's logits is (c q_v - p_v [v in K] - m q_v / q_tail
// [v not in K]) / T with c = sum_K p + m: for ghost the teacher's tail is spread like the
// student's own. Per-token values are summed over tokens of weight 1, scaled by T^2 when asked,
// and, with hard targets, the LM cross-entropy rides along on the same student logits. The
// gradient is formed in forward chunk by chunk (as HeadLogits::gradient_in_forward), so no
// [tokens, vocab] tensor outlives a chunk.
#pragma once
#include <torch/torch.h>

#include "distill/logit_losses.h"

namespace retort::distill {

// The cached teacher of n tokens.
struct SparseTeacher {
  torch::Tensor log_probs;      // [n, k] log-probabilities over the whole vocabulary, at T
  torch::Tensor ids;            // [n, k] int64 global ids, distinct per token
  torch::Tensor tail_log_mass;  // [n] log of the mass outside them (-inf: none)
};

// student: the head as in logit_distillation_from_heads (a sink must not stream rows);
// weight [n] of 0/1; targets [n] or undefined (no cross-entropy); vocab_size: the ids the loss
// runs over (every cached id lies below it). options.kind: forward_kl or soft_ce.
LogitLossValue logit_distillation_from_cache(const HeadInput& student, const SparseTeacher& teacher,
                                             const torch::Tensor& weight,
                                             const torch::Tensor& targets, int64_t vocab_size,
                                             const LogitLossOptions& options,
                                             const layers::TensorParallel& tp,
                                             const LossFactors& factors,
                                             layers::RunContext* run = nullptr);

}  // namespace retort::distill
