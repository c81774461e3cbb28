// engine/trainer.h: the training loop for one rank of a TP x PP x DP layout: builds this
// rank's shard of the model (its pipeline stage's layers) from the parameter specs, the
// AdamW optimizer and its slice of the data; each step runs the micro-batches (in 1F1B order
// under pipeline parallelism, trainer_pipeline.cpp) with the loss divided by the global
// number of target tokens (all micro-batches, all DP ranks), makes gradients whole (TP
// partial sums, DP buckets overlapped with backward, tied embeddings across stages), clips
// the global norm, steps the optimizer, logs, evaluates and checkpoints.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <iosfwd>
#include <memory>
#include <set>
#include <vector>

#include "distill/distillation.h"
#include "engine/adamw.h"
#include "engine/batches.h"
#include "engine/checkpoint.h"
#include "engine/data_setup.h"
#include "engine/grad_sync.h"
#include "engine/lr_schedule.h"
#include "engine/metrics.h"
#include "engine/train_config.h"
#include "engine/zero_partition.h"
#include "layers/model.h"
#include "parallel/mesh.h"

namespace retort::engine {

// Optional observers of a step, for the consistency suite and tools.
struct StepInspector {
  // Capture points recorded on every micro-batch: the student's and, when distilling, the
  // teacher's.
  std::set<std::string> captures, teacher_captures;
  // After each micro-batch's forward, before any loss consumes a capture: the recorded
  // captures (this rank's shards; under pipeline parallelism those of this stage's layers,
  // called inside the schedule) and the position of the micro-batch's first sample in the
  // global batch.
  std::function<void(int64_t step, int64_t first_sample, layers::CaptureSink& student,
                     layers::CaptureSink& teacher)>
      on_captures;
  // After gradients are whole across ranks, before clipping and the optimizer step (under
  // ZeRO-1 a rank then holds the gradients of the parameters it owns only).
  std::function<void(int64_t step, double loss)> on_gradients;
  // After the optimizer step (and, under ZeRO-1, the parameter all-gather), with the global
  // gradient norm measured before clipping.
  std::function<void(int64_t step, double grad_norm)> on_step_end;
  bool inspects_captures() const {
    return on_captures && !(captures.empty() && teacher_captures.empty());
  }
};

// Where a pipeline stage's time went in its last step's schedule: running its forwards and
// backwards (busy) against the whole schedule, from a barrier of all stages before it to one
// after it (wall); the rest is bubble, imbalance and communication.
struct PipelineTiming {
  double busy_s = 0, wall_s = 0;
};

class Trainer {
 public:
  // mesh: null for a single process without MPI. `log` receives console lines (pass it on
  // world rank 0 only).
  Trainer(const TrainConfig& config, std::ostream* log, parallel::Mesh* mesh = nullptr);

  // Trains from the current position to training.steps; returns the loss of every step run.
  std::vector<double> run();
  // One optimizer step at the current position; returns its loss (global, all DP ranks).
  double train_step();
  // Mean loss over training.eval_batches global batches of the validation stream.
  double evaluate();
  void save(const std::string& path);

  int64_t step() const { return progress_.step; }
  // The loss parts of the last step (global over DP), when distilling.
  const distill::LossTerms& last_terms() const { return step_terms_; }
  distill::Teacher* teacher() { return teacher_.get(); }
  layers::ParameterStore& parameters() { return *store_; }
  AdamW& optimizer() { return *optimizer_; }
  const layers::TensorParallel& tensor_parallel() const { return tp_; }
  void set_inspector(StepInspector* inspector) { inspector_ = inspector; }
  ZeroPartition* zero() { return zero_.get(); }
  DataParallelGradSync* dp_sync() {
    return dp_sync_.get();
  }  // null unless DP>1 without ZeRO  // null unless optimizer.zero_stage=1, DP>1
  bool is_root() const { return !mesh_ || mesh_->world_rank() == 0; }
  // This rank's pipeline stage: its layers, embedding and head.
  const layers::ModelStage& stage() const { return stage_; }
  // The pipeline group when there is more than one stage, else null.
  parallel::Communicator* pipeline() const { return pipeline_; }
  const PipelineTiming& pipeline_timing() const { return pipeline_timing_; }

 private:
  torch::Tensor to_tensor(const std::vector<int64_t>& values, int64_t batch) const;
  // Loss of one micro-batch divided by target_count (LM only, or the distillation mix);
  // `first_sample`: its position in the global batch, for the inspector.
  torch::Tensor micro_batch_loss(const TokenBatch& batch, double target_count,
                                 int64_t first_sample, int64_t step);
  // The capture points a micro-batch records, student and teacher: the distillation pairs'
  // (on this stage) and the inspector's.
  std::set<std::string> wanted_captures() const;
  std::set<std::string> wanted_teacher_captures() const;
  bool inspecting_captures() const { return inspector_ && inspector_->inspects_captures(); }
  void initialise_student();
  void build_distiller();
  void log_line(const std::string& line);
  double dp_sum(double value);
  // Sums the step's loss and its parts over `group` (pipeline stages, DP ranks).
  void sum_step_over(parallel::Communicator& group, double& loss);

  // Pipeline parallelism (trainer_pipeline.cpp): one step's micro-batches through this
  // stage in 1F1B order, returning this stage's part of the loss; and the summed validation
  // loss of `micro` (on the last stage; 0 on the others).
  double pipeline_micro_batches(const std::vector<TokenBatch>& micro,
                                const std::vector<int64_t>& first_samples, double target_count);
  double pipeline_evaluate_loss_sum(const std::vector<TokenBatch>& micro);

  TrainConfig config_;
  std::ostream* log_;
  parallel::Mesh* mesh_;
  layers::TensorParallel tp_;
  layers::ModelStage stage_;
  parallel::Communicator* pipeline_ = nullptr;
  int dp_rank_ = 0, dp_size_ = 1;
  torch::ScalarType dtype_;
  std::unique_ptr<layers::ParameterStore> store_;
  std::unique_ptr<layers::LlamaModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<distill::Teacher> teacher_;
  std::unique_ptr<distill::Distiller> distiller_;
  distill::LossTerms step_terms_;  // this step's loss parts, summed over micro-batches
  std::unique_ptr<DataParallelGradSync> dp_sync_;
  std::unique_ptr<ZeroPartition> zero_;  // ZeRO-1 over DP, instead of dp_sync_
  SampleStreams streams_;
  LrSchedule schedule_;
  TrainingProgress progress_;
  StepInspector* inspector_ = nullptr;
  double flops_per_token_ = 0;
  double peak_gflops_ = 0;
  double last_grad_norm_ = 0, last_lr_ = 0;
  PipelineTiming pipeline_timing_;
};

}  // namespace retort::engine
