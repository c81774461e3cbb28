// engine/checkpoint.h: one HDF5 file per checkpoint holding every parameter at global shape
// (/params/<name>), the AdamW state (/optimizer/exp_avg/<name>, /optimizer/exp_avg_sq/<name>),
// and the scalars needed to resume exactly: step, optimizer steps, seed, consumed samples and
// the torch CPU generator state. Files are written to a temporary name and renamed, so a
// crash while saving never damages the checkpoint already on disk.
#pragma once
#include <cstdint>
#include <string>

#include "engine/adamw.h"
#include "engine/zero_partition.h"
#include "layers/parameters.h"
#include "layers/tensor_parallel.h"

namespace retort::engine {

struct TrainingProgress {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // data position
  uint64_t seed = 0;
};

// Collective over the TP group: shards are gathered to global shape and only the rank with
// `writer` true writes the file (one writer per model replica set, i.e. world rank 0).
void save_checkpoint(const std::string& path, const layers::ParameterStore& store,
                     AdamW* optimizer, const TrainingProgress& progress,
                     const layers::TensorParallel& tp = {}, bool writer = true,
                     ZeroPartition* zero = nullptr);

// Loads parameters (strict: every name present with the same global shape) and, when
// optimizer is non-null, the optimizer state, each rank taking its own shard, so any layout
// loads a checkpoint written under any other. Returns the saved progress.
TrainingProgress load_checkpoint(const std::string& path, layers::ParameterStore& store,
                                 AdamW* optimizer, const layers::TensorParallel& tp = {});

// "<dir>/checkpoints/step_<step>.h5"
std::string checkpoint_path(const std::string& run_dir, int64_t step);
// Resolves checkpoint.load: a file is used as is; a run directory means its latest checkpoint.
std::string resolve_checkpoint(const std::string& file_or_run_dir);

}  // namespace retort::engine
