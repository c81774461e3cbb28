// distill/distillation.h: the distillation objective of one micro-batch: the LM loss, the
// logit loss against the teacher and the activation losses of the configured pairs of
// (student capture point, teacher capture point), each weighted and normalised by the global
// number of target tokens. A teacher activation is released as soon as its loss is built.
// When teacher and student hidden sizes differ, each pair gets a learned projection
// (student -> teacher width), a parameter of the student replicated over TP.
//
// The logit loss may take its teacher from a teacher cache instead (take_logits_from_cache):
// the teacher, if any, then runs only for the activation losses.
//
// Under pipeline parallelism a Distiller serves one stage: it builds the activation losses
// (and projections) of the pairs whose student layer runs there, and the LM and logit
// losses on the last stage, each stage adding its part to the one loss it back-propagates.
#pragma once
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "distill/activation_losses.h"
#include "distill/cached_logit_loss.h"
#include "distill/logit_losses.h"
#include "distill/pending_terms.h"
#include "distill/teacher.h"

namespace retort::distill {

// "layers.1.mixer_output=layers.2.mixer_output" pairs plus the shorthand of points taken at
// every student layer with the same teacher index; checks names against both models.
std::vector<ActivationPair> make_activation_pairs(const std::vector<std::string>& explicit_pairs,
                                                  const std::vector<std::string>& every_layer,
                                                  int64_t student_layers, int64_t teacher_layers);

class Distiller {
 public:
  // student_stage: the student layers of this pipeline stage (default: all). teacher: null
  // when nothing needs it (the logits come from a cache and no activation is distilled).
  Distiller(DistillConfig config, Teacher* teacher, const layers::ModelConfig& student,
            layers::ParameterStore& student_store, const layers::TensorParallel& tp,
            layers::ModelStage student_stage = {});
  // The logit loss reads a cached teacher of `vocab_size` ids (output_loss_from_cache).
  void take_logits_from_cache(int64_t vocab_size) { cached_vocab_size_ = vocab_size; }
  // Capture points of the pairs on this stage.
  std::set<std::string> student_captures() const;
  std::set<std::string> teacher_captures() const;
  const std::vector<ActivationPair>& pairs() const { return config_.pairs; }
  bool uses_activations() const { return config_.activation_weight > 0; }
  bool needs_teacher() const { return needs_teacher_logits() || config_.activation_weight > 0; }
  bool needs_teacher_logits() const { return config_.logit_weight > 0 && cached_vocab_size_ == 0; }
  bool logits_from_cache() const { return config_.logit_weight > 0 && cached_vocab_size_ > 0; }
  // The run's kernel choices (the student model's), for the losses' products and row loops.
  void set_kernels(const layers::KernelPolicy& kernels) { kernels_ = kernels; }

  // The weighted LM and logit losses (the last stage's part) divided by target_count, from
  // the heads' inputs: the heads are fused into the losses, so no [tokens, vocab] tensor
  // outlives a chunk. recompute_heads (activation checkpointing): keep only the head inputs
  // and form the logits again in backward; otherwise form the gradient in forward and keep
  // it. `teacher` is unused without a logit loss; terms receives the parts. vocab_size: the
  // student's. The logit loss runs over the ids both models have (the smaller vocabulary: the
  // larger one's extra rows are padding of the same tokenizer); the LM loss over the student's.
  torch::Tensor output_loss(const HeadInput& student, const HeadInput& teacher,
                            const torch::Tensor& targets, double target_count, int64_t vocab_size,
                            int64_t lm_chunk_tokens, bool recompute_heads,
                            PendingTerms* terms) const;
  // output_loss with the teacher's logits known by their cached top k (logits_from_cache()).
  torch::Tensor output_loss_from_cache(const HeadInput& student, const SparseTeacher& teacher,
                                       const torch::Tensor& targets, double target_count,
                                       int64_t vocab_size, int64_t lm_chunk_tokens,
                                       PendingTerms* terms) const;
  // The summed (unweighted, T^2-scaled) logit loss against a cached teacher over the tokens
  // whose target counts, without gradients: the held-out logit loss.
  torch::Tensor cached_logit_sum(const HeadInput& student, const SparseTeacher& teacher,
                                 const torch::Tensor& targets, int64_t vocab_size) const;
  // The weighted activation losses of this stage's pairs (zero without any). Takes the
  // pairs' captures out of both sinks: the losses keep what their backward needs.
  torch::Tensor activation_loss(const torch::Tensor& targets, layers::CaptureSink& student_sink,
                                layers::CaptureSink& teacher_sink, double target_count,
                                PendingTerms* terms) const;

 private:
  bool local(size_t pair) const { return local_[pair]; }
  // The LM cross-entropy over the student's whole vocabulary, weighted; terms gets its part.
  torch::Tensor lm_loss(const HeadInput& student, const torch::Tensor& targets, double target_count,
                        int64_t vocab_size, int64_t lm_chunk_tokens, PendingTerms* terms) const;
  // The logit loss and the LM loss beside it, from the heads or from the cache.
  template <typename LogitLossOf>
  torch::Tensor logit_and_lm_loss(const HeadInput& student, const torch::Tensor& targets,
                                  double target_count, int64_t vocab_size, int64_t teacher_vocab,
                                  int64_t lm_chunk_tokens, PendingTerms* terms,
                                  const LogitLossOf& logit_loss) const;
  DistillConfig config_;
  Teacher* teacher_;
  int64_t cached_vocab_size_ = 0;  // > 0: the logits come from a cache of this vocabulary
  layers::TensorParallel tp_;
  layers::KernelPolicy kernels_;
  std::vector<torch::Tensor> projections_;  // per pair; undefined when widths agree
  std::vector<bool> local_;                 // per pair: its student layer runs here
};

}  // namespace retort::distill
