// distill/distillation.cpp: see distillation.h.
#include "distill/distillation.h"

#include <algorithm>
#include <cmath>

#include "common/fault_injection.h"
#include "common/user_error.h"
#include "layers/capture.h"
#include "layers/compute_copy.h"
#include "layers/vocab_parallel.h"
#include "layers/widened_products.h"
#include "parallel/primitives.h"

namespace retort::distill {
namespace {

constexpr int64_t kIgnore = layers::kIgnoreIndex;

// Checks "layers.<i>.<point>" against a model with `layers` blocks.
void check_capture(const std::string& name, int64_t layers, const std::string& who) {
  for (int64_t i = 0; i < layers; ++i)
    for (const char* point : layers::kCapturePoints)
      if (name == layers::capture_name(i, point)) return;
  throw UserError("distill: '" + name + "' is not a capture point of the " + who + " (" +
                  std::to_string(layers) + " layers; points mixer_output, mlp_output, " +
                  "block_output)");
}

}  // namespace

std::vector<ActivationPair> make_activation_pairs(const std::vector<std::string>& explicit_pairs,
                                                  const std::vector<std::string>& every_layer,
                                                  int64_t student_layers, int64_t teacher_layers) {
  std::vector<ActivationPair> pairs;
  for (const std::string& text : explicit_pairs) {
    const size_t eq = text.find('=');
    if (eq == std::string::npos)
      throw UserError("distill.activation_pairs: '" + text +
                      "' is not student_point=teacher_point");
    pairs.push_back({text.substr(0, eq), text.substr(eq + 1)});
  }
  for (const std::string& point : every_layer) {
    if (student_layers > teacher_layers)
      throw UserError("distill.activation_points: the student has " +
                      std::to_string(student_layers) + " layers but the teacher only " +
                      std::to_string(teacher_layers) + "; pair layers explicitly");
    for (int64_t i = 0; i < student_layers; ++i)
      pairs.push_back({layers::capture_name(i, point), layers::capture_name(i, point)});
  }
  for (const ActivationPair& p : pairs) {
    check_capture(p.student, student_layers, "student");
    check_capture(p.teacher, teacher_layers, "teacher");
  }
  return pairs;
}

Distiller::Distiller(DistillConfig config, Teacher* teacher, const layers::ModelConfig& student,
                     layers::ParameterStore& student_store, const layers::TensorParallel& tp,
                     layers::ModelStage student_stage)
    : config_(std::move(config)), teacher_(teacher), tp_(tp) {
  const int64_t end = student_stage.end_layer < 0 ? student.layers : student_stage.end_layer;
  for (const ActivationPair& pair : config_.pairs) {
    const int64_t layer = layers::capture_layer(pair.student);
    local_.push_back(layer >= student_stage.first_layer && layer < end);
  }
  if (!teacher) {
    TORCH_CHECK(config_.activation_weight == 0, "distill: activation losses need the teacher");
    return;  // no projection: no activation loss
  }
  const int64_t hs = student.hidden, ht = teacher->config().hidden;
  // A teacher with its head here serves the logit loss (one serving activations alone, its
  // logits cached, has none).
  if (config_.logit_weight > 0 && teacher->model().stage().head &&
      layers::padded_vocab_size(student, tp.size()) !=
          layers::padded_vocab_size(teacher->config(), tp.size()))
    throw UserError("distill: the student's vocabulary (" + std::to_string(student.vocab_size) +
                    ") and the teacher's (" + std::to_string(teacher->config().vocab_size) +
                    ") are not padded alike (layers::pad_vocabularies_alike)");
  for (size_t i = 0; i < config_.pairs.size(); ++i) {
    if (hs == ht || !local(i)) {
      projections_.emplace_back();
      continue;
    }
    layers::ParamSpec spec;
    spec.name = "distill.projections." + std::to_string(i) + ".weight";
    spec.shape = {ht, hs};
    spec.init_std = 1.0 / std::sqrt(double(hs));
    spec.sequence_replicated = true;  // replicated; partial gradients under STP
    projections_.push_back(student_store.create(spec));
  }
}

std::set<std::string> Distiller::student_captures() const {
  std::set<std::string> names;
  if (config_.activation_weight > 0)
    for (size_t i = 0; i < config_.pairs.size(); ++i)
      if (local(i)) names.insert(config_.pairs[i].student);
  return names;
}

std::set<std::string> Distiller::teacher_captures() const {
  std::set<std::string> names;
  if (config_.activation_weight > 0)
    for (size_t i = 0; i < config_.pairs.size(); ++i)
      if (local(i)) names.insert(config_.pairs[i].teacher);
  return names;
}

torch::Tensor Distiller::output_loss(const HeadInput& student, const HeadInput& teacher,
                                     const torch::Tensor& targets, double target_count,
                                     int64_t vocab_size, int64_t lm_chunk_tokens,
                                     bool recompute_heads, PendingTerms* terms) const {
  const int64_t teacher_vocab = config_.logit_weight > 0 ? teacher_->config().vocab_size : 0;
  return logit_and_lm_loss(
      student, targets, target_count, vocab_size, teacher_vocab, lm_chunk_tokens, terms,
      [&](const torch::Tensor& weight, const torch::Tensor& ce_targets, int64_t shared,
          const LossFactors& factors) {
        return logit_distillation_from_heads(student, teacher, weight, ce_targets, shared,
                                             config_.logits, tp_, factors,
                                             recompute_heads ? HeadLogits::formed_again_in_backward
                                                             : HeadLogits::gradient_in_forward,
                                             kernels_.run);
      });
}

torch::Tensor Distiller::output_loss_from_cache(const HeadInput& student,
                                                const SparseTeacher& teacher,
                                                const torch::Tensor& targets, double target_count,
                                                int64_t vocab_size, int64_t lm_chunk_tokens,
                                                PendingTerms* terms) const {
  TORCH_CHECK(logits_from_cache(), "output_loss_from_cache: the logits do not come from a cache");
  return logit_and_lm_loss(
      student, targets, target_count, vocab_size, cached_vocab_size_, lm_chunk_tokens, terms,
      [&](const torch::Tensor& weight, const torch::Tensor& ce_targets, int64_t shared,
          const LossFactors& factors) {
        return logit_distillation_from_cache(student, teacher, weight, ce_targets, shared,
                                             config_.logits, tp_, factors, kernels_.run);
      });
}

torch::Tensor Distiller::cached_logit_sum(const HeadInput& student, const SparseTeacher& teacher,
                                          const torch::Tensor& targets, int64_t vocab_size) const {
  torch::NoGradGuard no_grad;
  return logit_distillation_from_cache(student, teacher, targets.ne(kIgnore), torch::Tensor(),
                                       std::min(vocab_size, cached_vocab_size_), config_.logits,
                                       tp_, {1.0, 0.0}, kernels_.run)
      .kd_sum;
}

template <typename LogitLossOf>
torch::Tensor Distiller::logit_and_lm_loss(const HeadInput& student, const torch::Tensor& targets,
                                           double target_count, int64_t vocab_size,
                                           int64_t teacher_vocab, int64_t lm_chunk_tokens,
                                           PendingTerms* terms,
                                           const LogitLossOf& logit_loss) const {
  const bool with_lm = config_.lm_weight > 0;
  if (config_.logit_weight <= 0)
    return with_lm ? lm_loss(student, targets, target_count, vocab_size, lm_chunk_tokens, terms)
                   : torch::zeros({}, student.input.options());
  // The LM loss rides along with the logit loss on the same student logits where both cover
  // the same ids; a student with ids the teacher lacks takes its LM loss over all of its own.
  const int64_t shared = std::min(vocab_size, teacher_vocab);
  const bool lm_fused = with_lm && shared == vocab_size;
  if (with_lm && !lm_fused && student.weight_grad_sink)  // it takes one gradient per backward
    throw UserError("distill.lm_weight: the student's vocabulary (" + std::to_string(vocab_size) +
                    ") is larger than the teacher's (" + std::to_string(shared) +
                    "), so its LM loss runs apart from the logit loss, which a tied head or "
                    "optimizer.in_backward does not allow; set distill.lm_weight=0 or give the "
                    "student the teacher's vocabulary");
  const bool dropped = fault_injected(Fault::LogitTermOneTpRank) && tp_.rank() != 0;
  const LossFactors factors{dropped ? 0.0 : config_.logit_weight / target_count,
                            lm_fused ? config_.lm_weight / target_count : 0.0};
  LogitLossValue value =
      logit_loss(targets.ne(kIgnore), lm_fused ? targets : torch::Tensor(), shared, factors);
  terms->add(PendingTerms::Term::logits, value.kd_sum / target_count);
  if (lm_fused) terms->add(PendingTerms::Term::lm, value.ce_sum / target_count);
  if (with_lm && !lm_fused)
    return value.total +
           lm_loss(student, targets, target_count, vocab_size, lm_chunk_tokens, terms);
  return value.total;
}

torch::Tensor Distiller::lm_loss(const HeadInput& student, const torch::Tensor& targets,
                                 double target_count, int64_t vocab_size, int64_t lm_chunk_tokens,
                                 PendingTerms* terms) const {
  torch::Tensor ce_sum;
  if (lm_chunk_tokens > 0) {
    ce_sum = layers::fused_head_cross_entropy_sum(student.input, student.weight, targets,
                                                  vocab_size, tp_, lm_chunk_tokens,
                                                  student.weight_grad_sink, kernels_);
  } else {  // the unfused head asked for
    ce_sum =
        layers::vocab_parallel_cross_entropy(
            layers::matmul_widening(student.input, student.weight.t()), targets, vocab_size, tp_)
            .sum();
  }
  torch::Tensor lm = ce_sum / target_count;
  terms->add(PendingTerms::Term::lm, lm);
  return config_.lm_weight * lm;
}

torch::Tensor Distiller::activation_loss(const torch::Tensor& targets,
                                         layers::CaptureSink& student_sink,
                                         layers::CaptureSink& teacher_sink, double target_count,
                                         PendingTerms* terms) const {
  torch::Tensor sum;
  if (config_.activation_weight <= 0) return torch::zeros({});
  // Under STP capture points hold this rank's part of the sequence.
  torch::Tensor weight = targets.ne(kIgnore);
  torch::Tensor local_weight =
      tp_.sequence_parallel && tp_.size() > 1
          ? parallel::split_along(weight, parallel::kSequenceDim, *tp_.group)
          : weight;
  for (size_t i = 0; i < config_.pairs.size(); ++i) {
    if (!local(i)) continue;
    const ActivationPair& pair = config_.pairs[i];
    torch::Tensor s = student_sink.at(pair.student);
    if (projections_[i].defined())
      s = layers::matmul_widening(s, layers::in_type_of(projections_[i], s).t());
    torch::Tensor t = teacher_sink.take(pair.teacher);  // freed once this loss is built
    const double count = fault_injected(Fault::ActivationLocalTokens)
                             ? local_weight.sum().item<double>()
                             : target_count;
    torch::Tensor pair_loss =
        activation_distillation_sum(s, t, local_weight, config_.activation_kind, tp_) / count;
    terms->add_pair(pair.student, pair_loss);
    sum = sum.defined() ? sum + pair_loss : pair_loss;
  }
  // The losses' graphs keep what their backward needs (mse and l2: the difference); the
  // sink's own references to the student's captures would keep them until the end of the
  // micro-batch, through the logit loss's peak.
  std::set<std::string> used;
  for (size_t i = 0; i < config_.pairs.size(); ++i)
    if (local(i)) used.insert(config_.pairs[i].student);
  for (const std::string& name : used) student_sink.take(name);
  if (!sum.defined()) return torch::zeros({});
  terms->add(PendingTerms::Term::activations, sum);
  return config_.activation_weight * sum;
}

}  // namespace retort::distill
