// parallel/stage_collect.h: bringing named tensors held by different pipeline stages to the
// first stage, for the one rank that writes a checkpoint or a consistency record. Each
// stage sends its list (name, dtype, shape, data) over the pipeline group; blocking
// point-to-point, used outside the training schedule.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "parallel/communicator.h"

namespace retort::parallel {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Collective over `pp`. Stage 0 returns its own tensors followed by every other stage's, in
// stage order; the other stages return an empty list.
NamedTensors collect_on_first_stage(Communicator& pp, NamedTensors local);

}  // namespace retort::parallel
