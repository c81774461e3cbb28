// engine/optim/zero_partition.h: ZeRO stage 1 over the data-parallel group, at parameter
// granularity (as torch's ZeroRedundancyOptimizer): each trainable parameter is owned by
// one DP rank (greedy balance by size), which alone keeps its AdamW state and steps it.
// GradientSync reduce-scatters the gradients bucket by bucket so each owner receives the DP
// sum of its parameters; after the step the owners' parameters are all-gathered back to
// every rank in one flat buffer laid out by owner.
#pragma once
#include <vector>

#include "layers/parameters.h"
#include "parallel/communicator.h"

namespace retort::engine {

class ZeroPartition {
 public:
  ZeroPartition(const layers::ParameterStore& store, parallel::Communicator& dp);

  bool owns(size_t param) const { return owner_[param] == dp_.rank(); }
  int owner(size_t param) const { return owner_[param]; }
  // Copies every parameter from its owner to all DP ranks.
  void all_gather_parameters(layers::ParameterStore& store);
  parallel::Communicator& group() { return dp_; }

 private:
  parallel::Communicator& dp_;
  std::vector<int> owner_;                    // per parameter; -1 for frozen
  std::vector<std::vector<size_t>> by_rank_;  // parameters of each rank, in store order
  std::vector<int64_t> counts_;               // elements per rank
};

}  // namespace retort::engine
