// layers/rope_scaling.h: RoPE's inverse frequency for each rotation pair of a head, and the
// scale of its cos and sin tables, for each model.rope_scaling kind as transformers computes
// them (modeling_rope_utils.py: default, linear, llama3, yarn), in float64. The tables built
// from them (functional.h: rope_tables) serve every position, so generation beyond the
// original context uses the scaled frequencies too.
#pragma once
#include <torch/torch.h>

#include "layers/model_config.h"

namespace retort::layers {

struct RopeFrequencies {
  torch::Tensor inverse;          // [head_dim / 2], float64
  double attention_factor = 1.0;  // multiplies cos and sin (yarn's mscale)
};

// Plain RoPE: theta^(-2i / head_dim) for pair i.
RopeFrequencies rope_frequencies(int64_t head_dim, double theta);
// The model's own: plain RoPE, then its rope_scaling.
RopeFrequencies rope_frequencies(const ModelConfig& config);

}  // namespace retort::layers
