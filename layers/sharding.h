// layers/sharding.h: moving a parameter-shaped tensor between this rank's TP shard and the
// global (unpadded) shape the spec names. Checkpoints and the consistency suite use it, so a
// checkpoint written under one layout loads under any other.
#pragma once
#include <torch/torch.h>

#include "layers/parameters.h"
#include "layers/tensor_parallel.h"

namespace retort::layers {

// Gathers `local` (a shard of the parameter, or of its gradient / optimizer state) over the
// TP group along the spec's shard dimension and strips vocabulary padding. Collective over TP.
torch::Tensor to_global(const torch::Tensor& local, const layers::ParamSpec& spec,
                        const layers::TensorParallel& tp);
// This rank's shard of a global tensor (padding added), in `like`'s dtype.
torch::Tensor from_global(const torch::Tensor& global, const layers::ParamSpec& spec,
                          const layers::TensorParallel& tp, const torch::Tensor& like);

}  // namespace retort::layers
