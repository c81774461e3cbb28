// layers/linear_products.h: the linear layers' two weight products, forward y = x W^T and input
// gradient dx = dy W, each run by our AVX-512 tile loops (layers/tile_gemm.h) where those beat
// the BLAS and by torch::matmul elsewhere, and LinearProduct, the autograd function of y = x W^T
// that uses them (its weight gradient dW = dy^T x stays with the BLAS).
//
// Why: OpenBLAS packs both operands of every product into its own layout and, with beta = 0,
// first zeroes the output in a pass of its own (sgemm_beta); on the step's layer products
// (1024 tokens, inner dimension 512 or 1536) that is 11% of a step's samples on a Zen 5. The
// tile loops read the activations in place and pack only the weight, one 32-column panel at a
// time, straight into the output: bench_products (2 Zen 5 cores, AVX-512 kernels on both sides)
// measured them ahead on the layers' forward and input-gradient products with inner dimension
// <= 1536 (381-421 against 307-358 GFLOP/s) and behind where few rows share each packed panel
// (the LM head's 256-token chunks) or the inner dimension is 3072 (gate|up's input gradient),
// and behind on weight gradients. tile_product_pays() is that rule.
#pragma once
#include <torch/torch.h>

namespace retort::layers {

// Whether a product with `rows` rows of A and inner dimension `inner` runs faster by the tile
// loops than by the BLAS (for the products of this file; see above).
bool tile_product_pays(int64_t rows, int64_t inner);

// x [..., in] times W^T, W [out, in] -> [..., out].
torch::Tensor product_by_transposed(const torch::Tensor& x, const torch::Tensor& w);

// dy [..., out] times W, W [out, in] -> [..., in].
torch::Tensor product_by(const torch::Tensor& dy, const torch::Tensor& w);

// y = x W^T as an autograd function: backward forms dx by product_by and, when the weight
// needs a gradient, dW = dy^T x by the BLAS. Saves x and W (no copies).
struct LinearProduct : torch::autograd::Function<LinearProduct> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

}  // namespace retort::layers
