// layers/fused_ops.h: the element-wise parts of a Llama block as single autograd functions
// with hand-written backward passes over layers/cpu_kernels loops. Each one does in one pass
// what the composed torch ops of layers/functional.h do in several, and saves less for
// backward:
//   rms_norm: saves x and one inverse RMS per row (torch's composition also keeps x^2-sized
//             and normalised copies);
//   swiglu:   saves gate and up (not silu(gate));
//   rope:     rotates the projection's output in place and saves nothing.
// CPU float32 / float64 contiguous inputs take the loops; anything else (CUDA, half precision)
// falls back to layers/functional.h, which stays the reference the tests compare against.
#pragma once
#include <torch/torch.h>

namespace retort::layers {

// Same maths as rms_norm() in functional.h.
torch::Tensor fused_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(gate) * up.
torch::Tensor fused_swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// Applies RoPE to x [batch, seq, heads, head_dim] (position = index along seq) in place when
// x may be overwritten (it is not a leaf and no other autograd node saved it), and returns
// it. cos and sin are the [seq, head_dim] tables of rope_tables().
torch::Tensor fused_rope_(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace retort::layers
