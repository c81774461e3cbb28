// parallel/stage_collect.h: bringing named tensors held by the ranks of a group to its first
// rank, for the one rank that writes a checkpoint (over a pipeline group: the stages) or a
// consistency record (over a whole layout). Each rank sends its list (name, dtype, shape,
// data); blocking point-to-point, used outside the training schedule.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "parallel/communicator.h"

namespace retort::parallel {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Collective over `group`. Rank 0 returns its own tensors followed by every other rank's, in
// rank order; the other ranks return an empty list.
NamedTensors collect_on_first_rank(Communicator& group, NamedTensors local);

}  // namespace retort::parallel
