// layers/kernel_policy.h: which implementation of a block's parts runs: the one-pass fused
// element-wise kernels (layers/fused_ops.h) or the composed torch ops (layers/functional.h),
// the blocked causal attention (layers/blocked_attention.h) or the dense one; and the run the
// layers belong to (layers/run_context.h: its kernel mode, compute copies and gradient memory).
// Set from the memory.fused_kernels and memory.attention_block_rows keys; each model holds its
// own, so trainers in one process never share one. Plain C++.
#pragma once
#include <cstdint>

#include "kernels/dispatch.h"

namespace retort::layers {

struct RunContext;

// The mode of code that runs outside a trainer (tests, benches, tools): the environment's
// (RETORT_KERNELS), automatic when unset.
inline kernels::KernelMode environment_kernel_mode() {
  return kernels::kernel_mode_for(kernels::KernelMode::automatic);
}

struct KernelPolicy {
  bool fused = true;
  int64_t attention_block_rows = 128;  // 0: dense attention with the [s, s] mask
  // The fused head's element-wise steps as row loops where the mode routes them there; off,
  // as torch ops, as under TP (bench_head measures the two against each other).
  bool head_row_loops = true;
  RunContext* run = nullptr;  // null: the environment's mode, nothing cached or offered

  kernels::KernelMode mode() const;
};

}  // namespace retort::layers
