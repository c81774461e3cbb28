// layers/linear_products.h: the linear layers' two weight products, forward y = x W^T and input
// gradient dx = dy W, each run in the activations' type (the weight's compute copy,
// layers/compute_copy.h, when the weight is wider), each by our AVX-512 tile loops
// (kernels/tile_gemm.h) where those beat the BLAS and by torch::matmul elsewhere, and
// LinearProduct, the autograd function of y = x W^T that uses them (its weight gradient dW = dy^T x
// stays with the BLAS).
//
// Why: the tile loops read the activations in place and pack only the weight, one 32-column
// panel at a time, straight into the output. Against the wheel's MKL, bench_products
// (`bench_products 2 3 <tokens> <head_chunk>`) puts them ahead or level on the layers'
// forward and input-gradient products at 256 rows, and behind at 1024 rows, on the LM head's
// long inner dimension (its input gradient) and on every weight gradient.
// The rule is kernels/dispatch.h's (Operation::linear_product, its kTileProducts table).
#pragma once
#include <torch/torch.h>

#include "layers/run_context.h"

namespace retort::layers {

// Each product asks the dispatch under the run's kernel mode whether the tile loops take it, and
// takes a wider weight's compute copy from the run (layers/run_context.h; null: no run, the
// environment's mode, a cast at each use).
// x [..., in] times W^T, W [out, in] -> [..., out].
torch::Tensor product_by_transposed(const torch::Tensor& x, const torch::Tensor& w,
                                    RunContext* run = nullptr);

// dy [..., out] times W, W [out, in] -> [..., in].
torch::Tensor product_by(const torch::Tensor& dy, const torch::Tensor& w,
                         RunContext* run = nullptr);

// out = dy W for 2-D dy, written into `out` [rows, in] (a contiguous row range is fine): the
// LM head's input gradient, chunk of tokens by chunk.
void product_by_out(torch::Tensor& out, const torch::Tensor& dy, const torch::Tensor& w,
                    RunContext* run = nullptr);

// out = a b, formed in a and b's type and stored in out's (a float32 gradient of a bf16 product).
void product_into(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b);

// y = x W^T as an autograd function: backward forms dx by product_by and, when the weight
// needs a gradient, dW = dy^T x by the BLAS, in memory the run offered for it where it did.
// Saves x and W (no copies). Its products belong to `run` (may be null), forward and backward.
struct LinearProduct : torch::autograd::Function<LinearProduct> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w, RunContext* run);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

}  // namespace retort::layers
