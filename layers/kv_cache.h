// layers/kv_cache.h: the keys and values of earlier positions, per block, for incremental
// decoding: each block's k and v [batch, local kv heads, capacity, head_dim] (this rank's
// heads under TP, after RoPE), filled up to `length`. Preallocated, so appending a token
// copies only its own keys and values and a step costs what its new tokens cost.
#pragma once
#include <torch/torch.h>

#include <vector>

namespace retort::layers {

struct KvCache {
  std::vector<torch::Tensor> keys, values;  // per block of the model, allocated on first use
  int64_t length = 0;                       // positions held
  int64_t capacity = 0;                     // positions each tensor has room for
};

}  // namespace retort::layers
