// layers/linear_products.h: the linear layers' two weight products, forward y = x W^T and input
// gradient dx = dy W, each run by our AVX-512 tile loops (layers/tile_gemm.h, or in cache
// blocks by layers/blocked_product.h) where those beat the BLAS and by torch::matmul elsewhere, and
// LinearProduct, the autograd function of y = x W^T that uses them (its weight gradient dW = dy^T x
// stays with the BLAS).
//
// Why: OpenBLAS packs both operands of every product into its own layout and, with beta = 0,
// first zeroes the output in a pass of its own (sgemm_beta); on the step's layer products
// (1024 tokens, inner dimension 512 or 1536) that is 11% of a step's samples on a Zen 5. The
// tile loops read the activations in place and pack only the weight, one 32-column panel at a
// time, straight into the output: bench_products (2 Zen 5 cores, AVX-512 kernels on both sides)
// measured them ahead on the layers' forward and input-gradient products at 128-1024 rows
// (373-425 against 240-339 GFLOP/s) and on the LM head's chunks of 64-256 rows (286-354 against
// 239-325), level or behind where A is 12 MB (gate|up's input gradient at 1024 rows, inner
// dimension 3072), and behind on weight gradients. With the inner dimension 32000 (the LM
// head's input gradient) a panel no longer fits the caches: there the blocked form leads
// (256-334 against 224-304). tile_product_pays() and blocked_product_pays() are that rule.
#pragma once
#include <torch/torch.h>

namespace retort::layers {

// Whether a product with `rows` rows of A and inner dimension `inner` runs faster by the tile
// loops than by the BLAS (for the products of this file; see above).
bool tile_product_pays(int64_t rows, int64_t inner);

// The same for the blocked form (dy W with a long inner dimension).
bool blocked_product_pays(int64_t rows, int64_t inner);

// x [..., in] times W^T, W [out, in] -> [..., out].
torch::Tensor product_by_transposed(const torch::Tensor& x, const torch::Tensor& w);

// dy [..., out] times W, W [out, in] -> [..., in].
torch::Tensor product_by(const torch::Tensor& dy, const torch::Tensor& w);

// out = dy W for 2-D dy, written into `out` [rows, in] (a contiguous row range is fine): the
// LM head's input gradient, chunk of tokens by chunk.
void product_by_out(torch::Tensor& out, const torch::Tensor& dy, const torch::Tensor& w);

// y = x W^T as an autograd function: backward forms dx by product_by and, when the weight
// needs a gradient, dW = dy^T x by the BLAS. Saves x and W (no copies).
struct LinearProduct : torch::autograd::Function<LinearProduct> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

}  // namespace retort::layers
