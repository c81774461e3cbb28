// engine/observe/run_summary.h: what --dry-run prints: parameter count, training FLOPs per token
// and an estimate of memory per rank (weights, gradients, AdamW state, activations of one
// micro-batch). No torch here.
#pragma once
#include <string>

#include "engine/config/train_config.h"

namespace retort::engine {

// weights: the main weights, and under bf16 mixed precision their bf16 copies too.
struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, optimizer = 0, activations = 0;
  int64_t total() const { return weights + gradients + optimizer + activations; }
};

MemoryEstimate estimate_memory(const TrainConfig& config);
std::string run_summary(const TrainConfig& config);

}  // namespace retort::engine
