// layers/tensor_parallel.cpp: see tensor_parallel.h.
#include "layers/tensor_parallel.h"

#include "parallel/primitives.h"

namespace retort::layers {

torch::Tensor TensorParallel::enter_column(const torch::Tensor& x) const {
  if (group->size() == 1) return x;
  return sequence_parallel ? parallel::gather_from_sp(x, *group) : parallel::copy_to_tp(x, *group);
}

torch::Tensor TensorParallel::exit_row(const torch::Tensor& x) const {
  if (group->size() == 1) return x;
  return sequence_parallel ? parallel::reduce_scatter_to_sp(x, *group)
                           : parallel::reduce_from_tp(x, *group);
}

}  // namespace retort::layers
