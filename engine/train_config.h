// engine/train_config.h: the typed view of a Config that the trainer uses, with the checks
// that span several keys (batch arithmetic, head counts, window list length, blend weights).
// No torch here.
#pragma once
#include <string>
#include <vector>

#include "engine/config.h"
#include "layers/model_config.h"
#include "parallel/layout.h"
#include "parallel/pipeline_partition.h"

namespace retort::engine {

struct DataConfig {
  std::vector<std::string> paths;
  std::vector<double> weights;
  std::vector<std::string> valid_paths;
  double valid_fraction = 0.05;
  int64_t seq_len = 32;
};

struct OptimizerConfig {
  double lr = 3e-3, min_lr = 3e-4;
  std::string schedule = "cosine";
  int64_t warmup_steps = 10, decay_steps = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
  int zero_stage = 0;
};

struct TrainingConfig {
  int64_t steps = 100, micro_batch = 4, global_batch = 8;
  int64_t log_every = 10, eval_every = 50, eval_batches = 4;
};

struct CheckpointConfig {
  int64_t save_every = 0;
  bool save_at_end = true;
  std::string load;
};

// Which parameters train at what rate, and where a student starts from.
struct ParamPolicy {
  std::vector<std::string> freeze;     // globs
  std::vector<std::string> lr_scales;  // "glob=scale"
  std::string init_from;
  std::vector<std::string> init_reset;  // globs
  // lr_scale for a parameter name: first lr_scales match, else 0 if frozen, else 1.
  double lr_scale(const std::string& name) const;
};

struct DistillSettings {
  bool enabled = false;  // any teacher-based weight > 0
  std::string teacher_checkpoint;
  uint64_t teacher_seed = 0;
  layers::ModelConfig teacher;
  bool teacher_shape_given = false;  // any teacher.<size> key set; else from its checkpoint
  double lm_weight = 1, logit_weight = 0, activation_weight = 0;
  std::string logit_loss = "forward_kl", activation_loss = "mse";
  double temperature = 1;
  bool scale_t2 = true;
  int64_t chunk_tokens = 32, teacher_top_k = 0;
  std::vector<std::string> activation_pairs, activation_points;
};

struct TrainConfig {
  std::string run_dir;
  uint64_t seed = 0;
  std::string dtype = "float32";
  layers::ModelConfig model;
  ParamPolicy params;
  DistillSettings distill;
  DataConfig data;
  TrainingConfig training;
  OptimizerConfig optimizer;
  CheckpointConfig checkpoint;
  parallel::Layout layout;
  std::vector<parallel::LayerRange> stages;  // the student's layers per pipeline stage
  double dp_bucket_mb = 4;
  std::string device = "cpu";
  int threads = 0;
  double peak_gflops = 0;

  // Micro-batches each data-parallel rank runs per optimizer step.
  int64_t accumulation_steps() const {
    return training.global_batch / (training.micro_batch * layout.data);
  }
};

// Builds the typed config and checks cross-key rules; throws UserError naming the keys.
// The layout's data size must already be resolved (see parallel::resolve_layout).
TrainConfig make_train_config(const Config& config, int world_size);

}  // namespace retort::engine
