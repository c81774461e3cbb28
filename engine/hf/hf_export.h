// engine/hf/hf_export.h: a Retort checkpoint out to a Hugging Face directory, and a Hugging
// Face directory in to a Retort checkpoint (engine_convert). Export writes config.json and the
// weights in Hugging Face names and order, as model.safetensors or, when they exceed
// shard_bytes, as model-0000i-of-0000n.safetensors shards with model.safetensors.index.json;
// it reads and writes one tensor at a time, so it never holds more than one in memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/hf/safetensors.h"

namespace retort::hf {

struct ExportOptions {
  uint64_t shard_bytes = 5ull << 30;  // Hugging Face's default max_shard_size, 5 GB
  StDtype dtype = StDtype::F32;       // F32, BF16 or F16
  // "" = the model's own type (hf_config_json); "phi3": Phi-3's layout, q/k/v and gate/up
  // joined into qkv_proj and gate_up_proj (engine/hf/hf_phi3.h).
  std::string model_type;
};

// `checkpoint`: a Retort checkpoint directory (with its model description). The directory is
// created. The weight files of an earlier export there (model.safetensors,
// model-*-of-*.safetensors, model.safetensors.index.json) are removed first, so that what is
// read back is exactly what this export wrote; other files (a tokenizer, say) are kept.
// Returns the names of the files removed.
std::vector<std::string> export_hf(const std::string& checkpoint, const std::string& out_dir,
                                   const ExportOptions& options);

struct ImportOptions {
  // Replace an existing checkpoint (or empty folder) at the destination; anything else there
  // is refused even so.
  bool force = false;
  // Point the parent folder's `latest` at the import (a run's checkpoints/ folder: the next
  // `checkpoint.load: auto` or engine_generate of that run would then take the import).
  bool set_latest = false;
};

// A Hugging Face directory to a Retort checkpoint directory (parameters and the model
// description, step 0), through a one-process model in float32. An existing destination is
// refused unless options.force.
void import_hf(const std::string& hf_dir, const std::string& checkpoint,
               const ImportOptions& options = {});

}  // namespace retort::hf
