// engine/optim/flat_copy.h: one flat message from many tensors and back, on torch's
// flatten/unflatten utilities: the shape of every bucketed collective (DP buckets, TP
// partial sums, ZeRO reduce-scatter and all-gather).
#pragma once
#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/torch.h>

#include <vector>

namespace retort::engine {

// A new contiguous 1-D tensor holding the tensors one after another.
inline torch::Tensor flatten(const std::vector<torch::Tensor>& tensors) {
  return torch::utils::flatten_dense_tensors(tensors);
}

// Copies `flat` (laid out as flatten(into)) back over the tensors.
inline void copy_back(const torch::Tensor& flat, const std::vector<torch::Tensor>& into) {
  const std::vector<torch::Tensor> parts = torch::utils::unflatten_dense_tensors(flat, into);
  for (size_t i = 0; i < into.size(); ++i) into[i].copy_(parts[i]);
}

}  // namespace retort::engine
