// layers/kernel_policy.h: which implementation of a block's parts runs: the one-pass fused
// element-wise kernels (layers/fused_ops.h) or the composed torch ops (layers/functional.h),
// and the blocked causal attention (layers/blocked_attention.h) or the dense one. Set from
// the memory.fused_kernels and memory.attention_block_rows keys. Plain C++.
#pragma once
#include <cstdint>

namespace retort::layers {

struct KernelPolicy {
  bool fused = true;
  int64_t attention_block_rows = 128;  // 0: dense attention with the [s, s] mask
};

}  // namespace retort::layers
