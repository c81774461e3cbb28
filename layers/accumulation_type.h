// layers/accumulation_type.h: the type sums and softmax statistics are taken in for a tensor
// of a given type: float32 for 16-bit floats (bfloat16 keeps 8 bits of mantissa, too few for a
// sum over a vocabulary or over chunks of tokens), else the tensor's own type.
#pragma once
#include <torch/torch.h>

namespace retort::layers {

inline torch::ScalarType accumulation_type(torch::ScalarType type) {
  return type == torch::kBFloat16 || type == torch::kHalf ? torch::kFloat : type;
}

inline torch::ScalarType accumulation_type(const torch::Tensor& x) {
  return accumulation_type(x.scalar_type());
}

}  // namespace retort::layers
