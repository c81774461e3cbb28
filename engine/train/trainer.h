// engine/train/trainer.h: the training loop of one rank of a TP x PP x DP layout. Its parts
// (this rank's shard of the model, the teacher and distiller when distilling, AdamW, the
// gradient synchronisation, its slice of the data) are assembled by build_trainer_parts
// (engine/train/trainer_builder.h) and only stored here. A step reads its micro-batches, runs
// them through the stage (StageStep, the one step path of every layout) with losses divided by
// the global number of target tokens, makes gradients whole (GradientSync), clips the global
// norm, steps the optimizer and returns a StepResult; run() loops steps, logs, evaluates and
// checkpoints.
#pragma once
#include <torch/torch.h>

#include <iosfwd>
#include <memory>
#include <optional>
#include <vector>

#include "distill/distillation.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/config/precision_policy.h"
#include "engine/config/train_config.h"
#include "engine/data/data_setup.h"
#include "engine/observe/console_log.h"
#include "engine/observe/metrics.h"
#include "engine/observe/tensorboard.h"
#include "engine/optim/adamw.h"
#include "engine/optim/grad_hooks.h"
#include "engine/optim/grad_sync.h"
#include "engine/optim/head_row_step.h"
#include "engine/optim/lr_schedule.h"
#include "engine/train/head_gradient.h"
#include "engine/train/stage_step.h"
#include "engine/train/step_inspector.h"
#include "engine/train/step_result.h"
#include "engine/train/trainer_builder.h"
#include "layers/model.h"
#include "layers/run_context.h"
#include "parallel/mesh.h"

namespace retort::engine {

class Trainer {
 public:
  // `mesh`: the parallel context of this rank (its layout must be config.layout). `log`
  // receives console lines (pass it on world rank 0 only).
  Trainer(const TrainConfig& config, std::ostream* log, parallel::Mesh& mesh);
  // A single process without MPI: a mesh of size-one groups.
  Trainer(const TrainConfig& config, std::ostream* log);
  ~Trainer();

  // Trains from the current position to training.steps; returns every step's result.
  std::vector<StepResult> run();
  // One optimizer step at the current position.
  StepResult train_step();
  // Mean LM loss over training.eval_batches global batches of the validation stream.
  double evaluate();
  // The same, and with a teacher cache holding the validation samples, the mean logit loss
  // against it (unweighted, as the logit_loss term).
  struct Validation {
    double lm_loss = 0;
    std::optional<double> logit_loss;
  };
  Validation validate();
  void save(const std::string& path);

  int64_t step() const { return parts_.progress.step; }
  distill::Teacher* teacher() { return parts_.teacher.get(); }
  layers::ParameterStore& parameters() { return *parts_.store; }
  AdamW& optimizer() { return *parts_.optimizer; }
  GradientSync& gradient_sync() { return *parts_.sync; }
  layers::ActivationOffloader* offloader() { return parts_.offloader.get(); }
  // Optimizer-in-backward with the fused LM head: its block-by-block stepper, else null.
  const HeadRowStepper* head_stepper() const { return parts_.head_stepper.get(); }
  // How this stage's LM head weight gets its gradient (engine/train/head_gradient.h).
  HeadGradient head_gradient() const { return parts_.head_gradient; }
  const layers::TensorParallel& tensor_parallel() const { return parts_.tp; }
  parallel::Mesh& mesh() { return mesh_; }
  void set_inspector(StepInspector* inspector) { inspector_ = inspector; }
  // The log stream is a terminal: a progress line is redrawn in place after every step.
  void set_terminal(bool terminal) { console_ = ConsoleLog(log_, terminal); }
  bool is_root() const { return mesh_.world_rank() == 0; }
  // This rank's pipeline stage: its layers, embedding and head.
  const layers::ModelStage& stage() const { return parts_.model->stage(); }
  // This run's kernel mode, compute copies and gradient memory (layers/run_context.h).
  layers::RunContext& run_context() { return *parts_.run; }

 private:
  Trainer(const TrainConfig& config, std::ostream* log, std::unique_ptr<parallel::Mesh> own_mesh,
          parallel::Mesh* mesh);
  // A batch tensor built on the host, on this rank's device.
  torch::Tensor placed(const torch::Tensor& host) const;
  void log_line(const std::string& line);
  // This step's micro-batches of this DP rank and the global number of target tokens.
  std::vector<MicroBatch> read_micro_batches(double& target_count);
  void clear_gradients();
  // Optimizer-in-backward: steps parameter k (its gradient final) and frees its gradient.
  void step_in_backward(size_t k);
  // The loss and its parts summed over pipeline stages, then over the gradient-reduction group
  // (the ranks that together read one global batch).
  void sum_over_ranks(StepResult& result);
  // value summed over the gradient-reduction group.
  double dp_sum(double value);
  // Sets result.skipped (a non-finite loss or gradient norm on any rank) and
  // result.stop_requested (a stop signal on any rank), agreed by the whole world.
  void agree_on_step(StepResult& result);
  void write_metrics(const StepResult& result, double seconds, double comm_seconds,
                     int64_t steps_in_interval, MetricsFile* metrics_file,
                     TensorBoardWriter* events);
  // The terminal's progress line after a step that took `seconds`.
  void show_progress(const StepResult& result, double seconds);

  TrainConfig config_;
  std::ostream* log_;
  ConsoleLog console_;
  std::unique_ptr<parallel::Mesh> own_mesh_;  // single process only
  parallel::Mesh& mesh_;
  // Everything build_trainer_parts assembled; its declaration order is the order of
  // destruction in reverse (the run context outlives every part that uses it).
  TrainerParts parts_;
  double step_lr_ = 0;                       // the learning rate of the step in progress
  std::vector<torch::Tensor> grad_squares_;  // optimizer-in-backward: squared norms before freeing
  LrSchedule schedule_;
  StepInspector* inspector_ = nullptr;
  int64_t consecutive_skips_ = 0;  // steps skipped in a row (non-finite), reset by a good one
  int64_t skipped_steps_ = 0;      // skipped by this process since it started
};

}  // namespace retort::engine
