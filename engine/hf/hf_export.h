// engine/hf/hf_export.h: a Retort checkpoint out to a Hugging Face directory, and a Hugging
// Face directory in to a Retort checkpoint (engine_convert). Export writes config.json and the
// weights in Hugging Face names and order, as model.safetensors or, when they exceed
// shard_bytes, as model-0000i-of-0000n.safetensors shards with model.safetensors.index.json;
// it reads and writes one tensor at a time, so it never holds more than one in memory.
#pragma once
#include <cstdint>
#include <string>

#include "engine/hf/safetensors.h"

namespace retort::hf {

struct ExportOptions {
  uint64_t shard_bytes = 5ull << 30;  // Hugging Face's default max_shard_size, 5 GB
  StDtype dtype = StDtype::F32;       // F32, BF16 or F16
};

// `checkpoint`: a Retort checkpoint directory (with its model description). The directory is
// created; files already there under the same names are replaced whole (each written to a
// .partial name and renamed).
void export_hf(const std::string& checkpoint, const std::string& out_dir,
               const ExportOptions& options);

// A Hugging Face directory to a Retort checkpoint directory (parameters and the model
// description, step 0), through a one-process model in float32.
void import_hf(const std::string& hf_dir, const std::string& checkpoint);

}  // namespace retort::hf
