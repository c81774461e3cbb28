// engine/train/stage_step.h: the one step path of every layout. A StageStep runs this rank's
// pipeline stage on micro-batches: without pipeline parallelism the stage is the whole
// model and the 1F1B schedule of one stage is F0 B0 F1 B1 ...; with it, the stages exchange
// hidden states and their gradients (parallel::run_one_forward_one_backward).
//
// The stage function (forward) embeds on the first stage, runs the stage's blocks, adds the
// activation losses of the pairs whose student layer runs here and, on the last stage, the
// LM and logit losses. What travels forward is the student's hidden state [b, s (/tp under
// STP), h], followed along the last dimension by the teacher's when distilling; what travels
// backward is the gradient of the student's part. Per micro-batch in flight a stage keeps
// only its input (a leaf that receives the gradient to send back) and the autograd edges of
// its output and of its loss part; the output tensor itself is dropped once sent.
// The one backward seeds both edges at once.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "distill/distillation.h"
#include "distill/pending_terms.h"
#include "engine/optim/grad_sync.h"
#include "engine/teacher_cache/cached_teacher.h"
#include "engine/train/step_inspector.h"
#include "engine/train/step_result.h"
#include "layers/model.h"

namespace retort::engine {

// One micro-batch: tokens and targets [b, s], the position of its first sample in the
// global batch (for the inspector) and in the sample stream (a teacher cache's address).
struct MicroBatch {
  torch::Tensor tokens, targets;
  int64_t first_sample = 0;
  int64_t stream_sample = 0;
  torch::Tensor host_tokens;  // tokens as read, on the host (bookkeeping without a device read)
};

// The models one stage runs; teacher and distiller are null without distillation, the cache
// without teacher.cache (the teacher too when the cache alone serves).
struct StageModels {
  layers::LlamaModel* student = nullptr;
  distill::Teacher* teacher = nullptr;
  distill::Distiller* distiller = nullptr;
  const CachedTeacher* cache = nullptr;
  const CachedTeacher* valid_cache = nullptr;  // the validation samples' entries
};

class StageStep {
 public:
  StageStep(StageModels models, const layers::TensorParallel& tp, int64_t seq_len,
            torch::ScalarType dtype);

  // One training step's micro-batches through this stage over the pipeline group `pp`
  // (size one without pipeline parallelism), each loss divided by target_count. Gradients
  // accumulate into .grad(); `sync` is armed before the last backward. This stage's part of the
  // loss (as value "loss") and of its terms go to `pending`, still on the device; `times`
  // receives this stage's times.
  void train(parallel::Communicator& pp, const std::vector<MicroBatch>& micro, double target_count,
             int64_t step, GradientSync& sync, StepInspector* inspector,
             distill::PendingTerms& pending, StepTimes& times);
  // Optimizer-in-backward: the LM head weight's gradient of each step's last micro-batch
  // goes to `sink` (formed in backward, block by block), not to autograd.
  void set_head_grad_sink(layers::HeadGradSink* sink) { head_grad_sink_ = sink; }
  // The summed LM loss of validation micro-batches (on the last stage; 0 on the others). With
  // the validation samples' cached teacher, logit_sum (not null) receives the summed logit loss
  // against it.
  double evaluate(parallel::Communicator& pp, const std::vector<MicroBatch>& micro,
                  double* logit_sum = nullptr);

 private:
  struct InFlight;
  // The capture points a micro-batch records, student and teacher: the distillation pairs'
  // (on this stage) and the inspector's.
  std::set<std::string> student_captures(const StepInspector* inspector) const;
  std::set<std::string> teacher_captures(const StepInspector* inspector) const;
  std::vector<int64_t> hidden_shape(int64_t batch, int64_t width) const;

  StageModels models_;
  layers::TensorParallel tp_;
  int64_t seq_len_;
  torch::ScalarType dtype_;
  layers::HeadGradSink* head_grad_sink_ = nullptr;
};

}  // namespace retort::engine
