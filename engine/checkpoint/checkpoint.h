// engine/checkpoint/checkpoint.h: sharded checkpoints that reshard across layouts
// (docs/checkpoint-format.md). A checkpoint is a directory: every rank that holds a piece
// nobody else writes (its TP shard of a parameter, on the first DP replica; optimizer state
// on its ZeRO owner) writes its own HDF5 file, rank_<r>.h5, in parallel, with no gather; rank 0
// then writes index.json (progress, model description, and per tensor its global shape and
// pieces: file, box, CRC-32C) and renames the directory from .partial into place, so a
// crash while saving never leaves a checkpoint that looks complete. Loading reads, for each
// local shard, the pieces that overlap it, checks each piece's checksum, and copies the
// overlap: any layout loads a checkpoint written under any other, and no rank holds more than
// its shards plus one piece.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/optim/adamw.h"
#include "engine/optim/zero_partition.h"
#include "layers/model_config.h"
#include "layers/parameters.h"
#include "layers/tensor_parallel.h"
#include "parallel/mesh.h"

namespace retort::engine {

struct TrainingProgress {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // data position
  uint64_t seed = 0;
  std::string model_json;  // the model's shape (model_config_json), stored with it
  int64_t seq_len = 0;     // the sequence length trained on (data.seq_len); 0 = not recorded
  std::string dtype;       // model.dtype trained in ("float32", "bfloat16", ...); "" = not recorded
  // The fingerprint of the tokenizer the ids mean (engine/data/tokenizer_fingerprint.h);
  // "" = not known.
  std::string tokenizer;
  uint64_t data_seed = 0;  // the data order's seed (data_order_seed); 0 = not recorded
};

// The shape of a model as JSON, and back; a checkpoint stores it under /model/config_json so
// a teacher can be built from its checkpoint alone.
std::string model_config_json(const layers::ModelConfig& config);
layers::ModelConfig model_config_from_json(const std::string& json, const std::string& source);
// The model shape stored in a checkpoint file, if it has one.
std::optional<layers::ModelConfig> read_checkpoint_model(const std::string& path);
// The sequence length a checkpoint was trained on, 0 if it does not record one.
int64_t read_checkpoint_seq_len(const std::string& path);
// The tokenizer fingerprint a checkpoint records, "" if none.
std::string read_checkpoint_tokenizer(const std::string& path);

// Collective over the mesh: shards are gathered to global shape over TP; under pipeline
// parallelism the stages send theirs to stage 0 over the pipeline group of TP and DP
// coordinate 0; world rank 0 alone writes the file. Under ZeRO-1 (`zero` non-null) the
// optimizer state comes from each parameter's owner. Tied copies are not written.
// point_latest: the parent folder's `latest` file then names this checkpoint.
void save_checkpoint(const std::string& path, parallel::Mesh& mesh,
                     const layers::ParameterStore& store, AdamW* optimizer, ZeroPartition* zero,
                     const TrainingProgress& progress, bool point_latest = true);

// Loads parameters (strict: every name present with the same global shape) and, when
// optimizer is non-null, the optimizer state, each rank taking its own shard, so any layout
// loads a checkpoint written under any other. Returns the saved progress. Under pipeline
// parallelism the store holds one stage's parameters, and the stages agree that every file
// parameter belongs to some stage. part_of_model: the store is knowingly a part of the saved
// model (a teacher built up to its last captured layer), so file parameters it lacks are left.
TrainingProgress load_checkpoint(const std::string& path, parallel::Mesh& mesh,
                                 layers::ParameterStore& store, AdamW* optimizer,
                                 bool part_of_model = false);

// Deletes all but the newest `keep` step checkpoints of run_dir (0 = keep all); `latest`
// always names one that is kept.
void prune_checkpoints(const std::string& run_dir, int64_t keep);

// "<dir>/checkpoints/step_<step>" (8 digits)
std::string checkpoint_path(const std::string& run_dir, int64_t step);
// The complete checkpoints of a run directory (with index.json; not .partial), newest first.
std::vector<std::string> complete_checkpoints(const std::string& run_dir);
// Every folder of a run directory named like a checkpoint (step_<step>, not .partial), with
// index.json or without (damaged, or copied in part), newest first.
std::vector<std::string> checkpoint_folders(const std::string& run_dir);
// Resolves checkpoint.load: a checkpoint directory is used as is; a run directory means its
// latest checkpoint.
std::string resolve_checkpoint(const std::string& checkpoint_or_run_dir);

// Whole global parameters of a checkpoint, one at a time, checksums checked (export).
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  std::vector<std::string> parameter_names() const;
  std::vector<int64_t> shape(const std::string& name) const;
  torch::Tensor parameter(const std::string& name) const;
  // Any stored tensor by key: "params/<name>", "optimizer/exp_avg/<name>",
  // "optimizer/exp_avg_sq/<name>".
  torch::Tensor tensor(const std::string& key) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace retort::engine
