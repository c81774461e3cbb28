// layers/tensor_parallel.h: how a layer is split over its tensor-parallel group, and the two
// places where the residual stream meets a split layer: entering a column-parallel layer
// (TP: copy_to_tp; STP: gather_from_sp along the sequence) and leaving a row-parallel one
// (TP: reduce_from_tp; STP: reduce_scatter_to_sp). With no group everything is local.
#pragma once
#include <torch/torch.h>

#include "layers/model_config.h"  // padded_vocab_size
#include "layers/parameters.h"
#include "parallel/communicator.h"

namespace retort::layers {

struct TensorParallel {
  // Never null: one process outside a mesh gets the process's one-rank group.
  parallel::Communicator* group = &parallel::Communicator::one_process();
  bool sequence_parallel = false;

  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
  ShardPosition position() const { return {rank(), size()}; }
  // Residual stream -> input of a column-parallel layer (full sequence, replicated).
  torch::Tensor enter_column(const torch::Tensor& x) const;
  // Partial output of a row-parallel layer -> residual stream (summed; seq-split under STP).
  torch::Tensor exit_row(const torch::Tensor& x) const;
};

}  // namespace retort::layers
