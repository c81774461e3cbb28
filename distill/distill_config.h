// distill/distill_config.h: the distillation objective's settings, the distill.* keys: the
// weights of the LM, logit and activation losses, the logit loss (kind, temperature, T^2
// scaling, teacher top-k, chunking) and the activation loss and its pairs. Plain C++.
#pragma once
#include <string>
#include <vector>

#include "common/config_fields.h"

namespace retort::distill {

RETORT_NAMED_ENUM(LogitLoss, forward_kl, reverse_kl, soft_ce)
RETORT_NAMED_ENUM(ActivationLoss, mse, cosine, l2)
// What a teacher known by its top k (a teacher cache) does with the mass outside them:
// renormalise the k to sum to one, or keep the tail as one more class (ghost).
RETORT_NAMED_ENUM(TopKTail, renormalise, ghost)

#define RETORT_LOGIT_LOSS_KEYS(KEY)                                                          \
  KEY(LogitLoss, kind, "distill.logit_loss", LogitLoss::forward_kl, 0, 0,                    \
      "logit distillation loss")                                                             \
  KEY(double, temperature, "distill.temperature", 1.0, 1e-3, 1e3, "softmax temperature")     \
  KEY(bool, scale_by_t2, "distill.scale_t2", true, 0, 0, "multiply the logit loss by T^2")   \
  KEY(int64_t, teacher_top_k, "distill.teacher_top_k", 0, 0, 1e9,                            \
      "keep the teacher's k largest logits per token (0 = all); forward_kl / soft_ce")       \
  KEY(TopKTail, top_k_tail, "distill.top_k_tail", TopKTail::renormalise, 0, 0,               \
      "with teacher.cache: renormalise the cached k, or ghost (the tail as one more class)") \
  KEY(int64_t, chunk_tokens, "distill.chunk_tokens", 192, 1, 1e9,                            \
      "tokens per logit-loss chunk (the default: bench_logit_loss, docs/benchmarks.md; "     \
      "with runtime.device=cuda, 4096)")

struct LogitLossOptions {
  // kind: forward_kl = KL(teacher || student), reverse_kl = KL(student || teacher), soft_ce.
  // teacher_top_k > 0: the teacher distribution keeps only its k largest logits per token
  // (renormalised; the k-th value is found across TP ranks). Not defined for reverse_kl.
  RETORT_LOGIT_LOSS_KEYS(RETORT_FIELD)
};

struct ActivationPair {
  std::string student, teacher;  // capture names, e.g. "layers.1.mixer_output"
};

#define RETORT_DISTILL_KEYS(KEY)                                                             \
  KEY(double, lm_weight, "distill.lm_weight", 1.0, 0, 1e6, "weight of the LM cross-entropy") \
  KEY(double, logit_weight, "distill.logit_weight", 0, 0, 1e6, "weight of the logit loss")   \
  KEY(double, activation_weight, "distill.activation_weight", 0, 0, 1e6,                     \
      "weight of activation losses")                                                         \
  KEY(ActivationLoss, activation_kind, "distill.activation_loss", ActivationLoss::mse, 0, 0, \
      "activation distillation loss")                                                        \
  KEY(std::vector<std::string>, pair_names, "distill.activation_pairs", {}, 0, 0,            \
      "'layers.i.point=layers.j.point' pairs (student=teacher)")                             \
  KEY(std::vector<std::string>, every_layer_points, "distill.activation_points", {}, 0, 0,   \
      "capture points distilled at every student layer from the same teacher layer")

struct DistillConfig {
  RETORT_DISTILL_KEYS(RETORT_FIELD)
  LogitLossOptions logits;
  std::vector<ActivationPair> pairs;  // resolved from pair_names and every_layer_points
};

}  // namespace retort::distill
