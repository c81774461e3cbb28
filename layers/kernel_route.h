// layers/kernel_route.h: kernels::route() (kernels/dispatch.h) asked about torch tensors: their
// device and element type described in the dispatch's own torch-free terms, under a run's
// kernel mode.
#pragma once
#include <torch/torch.h>

#include "kernels/dispatch.h"
#include "layers/run_context.h"

namespace retort::layers {

kernels::Work work_of(const torch::Tensor& t, int64_t rows = 0, int64_t inner = 0);

// Whether `op` on tensors like t runs our loops under `mode`.
inline bool runs_our_loops(kernels::KernelMode mode, kernels::Operation op, const torch::Tensor& t,
                           int64_t rows = 0, int64_t inner = 0) {
  return kernels::route(op, work_of(t, rows, inner), mode) == kernels::Route::ours;
}

// The block's element-wise parts: the fused forms when the policy asks for them and the
// dispatch sends tensors like x to our row loops.
inline bool fused_block_parts(const KernelPolicy& policy, const torch::Tensor& x) {
  return policy.fused && runs_our_loops(policy.mode(), kernels::Operation::block_row_loops, x);
}

}  // namespace retort::layers
