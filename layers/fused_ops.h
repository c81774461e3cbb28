// layers/fused_ops.h: the element-wise parts of a Llama block as single autograd functions
// with hand-written backward passes over kernels/row_loops.h loops. Each one does in one pass
// what the composed torch ops of layers/functional.h do in several, and saves less for
// backward:
//   rms_norm: saves x and one inverse RMS per row (torch's composition also keeps x^2-sized
//             and normalised copies);
//   swiglu:   saves the packed gate|up product output (not silu(gate));
//   rope:     rotates the projection's output in place and saves nothing.
// CPU float32 / float64 contiguous inputs take the loops; on CUDA the block's RMSNorm is ATen's
// fused operator; anything else falls back to layers/functional.h, which stays the reference
// the tests compare against.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "layers/kernel_policy.h"

namespace retort::layers {

// Same maths as rms_norm() in functional.h, the result in out_type (default x's). Our loops
// take x and weight alike in float or double, and bf16 rows (x bf16, or a float32 stream x
// with a bf16 result) with a float32 weight, computing in float32; anything else is composed.
torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                             std::optional<torch::ScalarType> out_type = std::nullopt);

// A block's RMSNorm of the residual stream x, the result in `compute` (the products' type;
// unset: x's), with the weight entering at its value in that type (as every weight does under
// mixed precision): by fused_rms_norm where the policy and the dispatch send x to our loops,
// else composed.
torch::Tensor stream_rms_norm(const KernelPolicy& policy, const torch::Tensor& x,
                              const torch::Tensor& weight, std::optional<torch::ScalarType> compute,
                              double eps);

// silu(gate) * up from gate_up [..., 2n] = [gate | up] (the output of one matrix product by
// the stacked gate and up weights) -> [..., n]. Backward writes the gradient packed the same
// way, so the one product's backward takes it whole.
// float, double or bf16 (computed in float32).
torch::Tensor fused_swiglu_packed(const torch::Tensor& gate_up);

// Applies RoPE in place to the first `rotated_heads` heads (all when -1) of x [batch, seq,
// heads * head_dim] or [batch, seq, heads, head_dim] (position = index along seq; a packed
// q|k|v projection output rotates its q and k heads and leaves v), and returns x. In place
// when x may be overwritten (not a leaf that requires grad; the projection's output is never
// saved by its own backward). cos and sin are the [seq, head_dim] tables of rope_tables(), of
// x's type, or float32 for a bf16 x (rotated in float32, rounded once).
torch::Tensor fused_rope_(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin,
                          int64_t rotated_heads = -1);

}  // namespace retort::layers
