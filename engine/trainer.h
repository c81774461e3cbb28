// engine/trainer.h: the training loop for one rank: builds the model from the parameter
// specs, the AdamW optimizer and the data streams; each step runs the micro-batches with
// the loss normalised by the global number of target tokens, clips the global gradient
// norm, steps the optimizer, logs, evaluates and checkpoints.
#pragma once
#include <torch/torch.h>

#include <iosfwd>
#include <memory>
#include <vector>

#include "engine/adamw.h"
#include "engine/checkpoint.h"
#include "engine/data_setup.h"
#include "engine/lr_schedule.h"
#include "engine/metrics.h"
#include "engine/train_config.h"
#include "layers/model.h"

namespace retort::engine {

class Trainer {
 public:
  // `log` receives the console lines (rank 0 only).
  Trainer(const TrainConfig& config, std::ostream* log);

  // Trains from the current position to training.steps; returns the loss of every step run.
  std::vector<double> run();
  // One optimizer step at the current position; returns its loss.
  double train_step();
  // Mean loss over training.eval_batches global batches of the validation stream.
  double evaluate();
  void save(const std::string& path);

  int64_t step() const { return progress_.step; }
  layers::ParameterStore& parameters() { return *store_; }
  AdamW& optimizer() { return *optimizer_; }

 private:
  torch::Tensor to_tensor(const std::vector<int64_t>& values, int64_t batch) const;
  void log_line(const std::string& line);

  TrainConfig config_;
  std::ostream* log_;
  torch::ScalarType dtype_;
  std::unique_ptr<layers::ParameterStore> store_;
  std::unique_ptr<layers::LlamaModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  SampleStreams streams_;
  LrSchedule schedule_;
  TrainingProgress progress_;
  double flops_per_token_ = 0;
  double peak_gflops_ = 0;
  double last_grad_norm_ = 0, last_lr_ = 0;
};

}  // namespace retort::engine
