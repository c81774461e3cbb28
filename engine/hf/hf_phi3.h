// engine/hf/hf_phi3.h: Phi-3's layout of the Llama block in Hugging Face names. Phi-3 (and
// Phi-4-mini) store q, k and v as one self_attn.qkv_proj (their rows in that order) and gate
// and up as one mlp.gate_up_proj (gate's rows first); everything else is named as Llama's.
// Import reads each of Retort's parameters as its rows of the fused tensor; export joins them
// again. Plain C++.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layers/model_config.h"

namespace retort::hf {

// Where the tensor a Llama-layout name stands for lives in Phi-3's layout: the fused tensor
// and the rows [first_row, first_row + rows) of it.
struct FusedRows {
  std::string tensor;
  int64_t first_row = 0, rows = 0;
};

// For q/k/v_proj.weight and gate/up_proj.weight of a layer (Llama-layout Hugging Face names):
// their place in Phi-3's fused tensors; nullopt for every other name (stored as it is).
std::optional<FusedRows> phi3_rows(const std::string& llama_name, const layers::ModelConfig& c);

// The Llama-layout names a Phi-3 fused tensor joins, in row order (empty for any other name).
std::vector<std::string> phi3_parts(const std::string& fused_name);

}  // namespace retort::hf
