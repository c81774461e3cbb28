// layers/fused_ops.h: the element-wise parts of a Llama block as single autograd functions
// with hand-written backward passes over kernels/row_loops.h loops. Each one does in one pass
// what the composed torch ops of layers/functional.h do in several, and saves less for
// backward:
//   rms_norm: saves x and one inverse RMS per row (torch's composition also keeps x^2-sized
//             and normalised copies);
//   swiglu:   saves the packed gate|up product output (not silu(gate));
//   rope:     rotates the projection's output in place and saves nothing.
// CPU float32 / float64 contiguous inputs take the loops; anything else (CUDA, half precision)
// falls back to layers/functional.h, which stays the reference the tests compare against.
#pragma once
#include <torch/torch.h>

#include "layers/kernel_policy.h"

namespace retort::layers {

// Same maths as rms_norm() in functional.h.
torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// RMSNorm of a float32 (or wider) residual stream x by the weight's `compute`-type value, the
// result in `compute` (rounded once): by fused_rms_norm where the policy and dispatch allow it,
// else by rms_norm.
torch::Tensor wide_rms_norm(const KernelPolicy& policy, const torch::Tensor& x,
                            const torch::Tensor& weight, torch::ScalarType compute, double eps);

// silu(gate) * up from gate_up [..., 2n] = [gate | up] (the output of one matrix product by
// the stacked gate and up weights) -> [..., n]. Backward writes the gradient packed the same
// way, so the one product's backward takes it whole.
torch::Tensor fused_swiglu_packed(const torch::Tensor& gate_up);

// Applies RoPE in place to the first `rotated_heads` heads (all when -1) of x [batch, seq,
// heads * head_dim] or [batch, seq, heads, head_dim] (position = index along seq; a packed
// q|k|v projection output rotates its q and k heads and leaves v), and returns x. In place
// when x may be overwritten (not a leaf that requires grad; the projection's output is never
// saved by its own backward). cos and sin are the [seq, head_dim] tables of rope_tables().
torch::Tensor fused_rope_(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin,
                          int64_t rotated_heads = -1);

}  // namespace retort::layers
