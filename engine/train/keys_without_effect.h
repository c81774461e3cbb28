// engine/train/keys_without_effect.h: keys a user set that change nothing in this run's
// setting (a bf16 key in fp32, a GPU key on the CPU, a DP key without its DP sum, a pair
// list without its weight). The trainer logs them once at start-up, from this one place, so a
// user never believes a key took effect that did not.
#pragma once
#include <string>
#include <vector>

#include "engine/config/train_config.h"

namespace retort::engine {

// What the trainer decided that the rules below depend on.
struct RunFacts {
  bool on_gpu = false;
  int dp_size = 1;
  bool dp_sum_in_shared_memory = false;
  // memory.defer_head_gradient applies to every micro-batch of the step.
  bool head_gradient_deferred = false;
};

// One line per key that has no effect here, each naming the key and where it applies.
std::vector<std::string> keys_without_effect(const TrainConfig& config, const RunFacts& facts);

}  // namespace retort::engine
