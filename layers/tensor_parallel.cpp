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

int64_t padded_vocab_size(int64_t vocab_size, int tp_size) {
  const int64_t multiple = 128 * int64_t(tp_size);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

}  // namespace retort::layers
