// parallel/primitives.h: the seven autograd communication primitives of docs/architecture.md, one
// function each, as in Megatron-core's mappings.py. With a group of one rank each is the
// identity in both directions.
//
// | primitive            | forward                 | backward               |
// |----------------------|-------------------------|------------------------|
// | copy_to_tp           | identity                | all-reduce             |
// | reduce_from_tp       | all-reduce              | identity               |
// | scatter_to_tp        | split last dim          | all-gather last dim    |
// | gather_from_tp       | all-gather last dim     | split last dim         |
// | scatter_to_sp        | split sequence dim      | all-gather sequence    |
// | gather_from_sp       | all-gather sequence dim | reduce-scatter         |
// | reduce_scatter_to_sp | reduce-scatter sequence | all-gather sequence    |
#pragma once
#include <torch/torch.h>

#include "parallel/communicator.h"

namespace retort::parallel {

inline constexpr int64_t kSequenceDim = 1;  // activations are [batch, sequence, hidden]

torch::Tensor copy_to_tp(const torch::Tensor& x, Communicator& tp);
torch::Tensor reduce_from_tp(const torch::Tensor& x, Communicator& tp);
torch::Tensor scatter_to_tp(const torch::Tensor& x, Communicator& tp);
torch::Tensor gather_from_tp(const torch::Tensor& x, Communicator& tp);
torch::Tensor scatter_to_sp(const torch::Tensor& x, Communicator& tp);
torch::Tensor gather_from_sp(const torch::Tensor& x, Communicator& tp);
torch::Tensor reduce_scatter_to_sp(const torch::Tensor& x, Communicator& tp);

// This rank's 1/size slice of x along dim (no communication, no autograd node of its own).
torch::Tensor split_along(const torch::Tensor& x, int64_t dim, const Communicator& group);

}  // namespace retort::parallel
