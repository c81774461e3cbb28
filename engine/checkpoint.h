// engine/checkpoint.h: one HDF5 file per checkpoint holding every parameter at global shape
// (/params/<name>), the AdamW state (/optimizer/exp_avg/<name>, /optimizer/exp_avg_sq/<name>),
// and the scalars needed to resume exactly: step, optimizer steps, seed, consumed samples and
// the torch CPU generator state. Files are written to a temporary name and renamed, so a
// crash while saving never damages the checkpoint already on disk.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "engine/adamw.h"
#include "engine/zero_partition.h"
#include "layers/model_config.h"
#include "layers/parameters.h"
#include "layers/tensor_parallel.h"

namespace retort::engine {

struct TrainingProgress {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // data position
  uint64_t seed = 0;
  std::string model_json;  // the model's shape (model_config_json), stored with it
};

// The shape of a model as JSON, and back; a checkpoint stores it under /model/config_json so
// a teacher can be built from its checkpoint alone.
std::string model_config_json(const layers::ModelConfig& config);
layers::ModelConfig model_config_from_json(const std::string& json, const std::string& source);
// The model shape stored in a checkpoint file, if it has one.
std::optional<layers::ModelConfig> read_checkpoint_model(const std::string& path);

// Collective over the TP group: shards are gathered to global shape and only the rank with
// `writer` true writes the file (one writer per model replica set, i.e. world rank 0).
// Under pipeline parallelism each stage holds part of the parameters: `pipeline` is the
// pipeline group of the writer's TP and DP coordinates (null on every other rank), over
// which the stages send theirs to the writer on stage 0. Tied copies are not written.
void save_checkpoint(const std::string& path, const layers::ParameterStore& store, AdamW* optimizer,
                     const TrainingProgress& progress, const layers::TensorParallel& tp = {},
                     bool writer = true, ZeroPartition* zero = nullptr,
                     parallel::Communicator* pipeline = nullptr);

// Loads parameters (strict: every name present with the same global shape) and, when
// optimizer is non-null, the optimizer state, each rank taking its own shard, so any layout
// loads a checkpoint written under any other. Returns the saved progress. Under pipeline
// parallelism the store holds one stage's parameters; `pipeline` (this rank's pipeline
// group) then lets the stages agree that every file parameter belongs to some stage.
TrainingProgress load_checkpoint(const std::string& path, layers::ParameterStore& store,
                                 AdamW* optimizer, const layers::TensorParallel& tp = {},
                                 parallel::Communicator* pipeline = nullptr);

// "<dir>/checkpoints/step_<step>.h5"
std::string checkpoint_path(const std::string& run_dir, int64_t step);
// Resolves checkpoint.load: a file is used as is; a run directory means its latest checkpoint.
std::string resolve_checkpoint(const std::string& file_or_run_dir);

}  // namespace retort::engine
