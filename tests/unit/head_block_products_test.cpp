// tests/unit/head_block_products_test.cpp: what the bitwise claims between the optimizer step
// inside backward and the plain step rest on (memory_exactness_*,
// Trainer.ResumeWithOptimizerInBackward). The streamed LM head (layers/vocab_parallel.cpp)
// forms, block of vocabulary rows by block, the logits again and the weight gradient; the
// plain step forms them for all rows at once. The two agree bitwise only if
//  (a) a block's logits are bitwise the same columns of all rows' logits. Both go through
//      layers/linear_products.h with the same rows and inner dimension, so the same route:
//      the tile loops sum each logit in the order of k whatever the number of columns; on
//      the BLAS's route it is the BLAS's kernel. (When the block's logits went to the BLAS
//      while the forward's took the tile loops, MKL_ENABLE_INSTRUCTIONS=AVX2 broke this.)
//  (b) a block's weight gradient z_block^T x (addmm, the BLAS) is bitwise the same rows of
//      z^T x: each element sums over the tokens in the same order whatever the number of
//      output rows. No BLAS documents this; MKL's kernels do it at these shapes.
// This checks both at the shapes those tests run (hidden 64 and 128, vocabularies 256 and
// 128 per rank, blocks of (rows + 7) / 8 rows, token chunks of 64 to 256), on 1 and 2
// threads; if a BLAS changes them, it names the shape, and the bitwise tests' failure has
// its cause.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "layers/linear_products.h"

namespace {

int64_t block_rows(int64_t rows) {
  return std::max<int64_t>(1, (rows + 7) / 8);
}

}  // namespace

TEST(HeadBlockProducts, BlockOfRowsIsBitwiseTheSameRowsOfTheWholeProduct) {
  const int previous_threads = at::get_num_threads();
  torch::manual_seed(3);
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (int64_t hidden : {64, 128}) {
      for (int64_t vocab : {128, 256}) {
        for (int64_t tokens : {64, 128, 256}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + " hidden " + std::to_string(hidden) +
                       " vocab " + std::to_string(vocab) + " tokens " + std::to_string(tokens));
          torch::Tensor x = torch::randn({tokens, hidden});
          torch::Tensor w = torch::randn({vocab, hidden}) * 0.1;
          torch::Tensor logits = retort::layers::product_by_transposed(x, w);
          torch::Tensor whole_grad = torch::zeros({vocab, hidden});
          whole_grad.addmm_(logits.t(), x);
          const int64_t block = block_rows(vocab);
          for (int64_t row = 0; row < vocab; row += block) {
            const int64_t rows = std::min(block, vocab - row);
            torch::Tensor z = retort::layers::product_by_transposed(x, w.narrow(0, row, rows));
            EXPECT_TRUE(torch::equal(z, logits.narrow(1, row, rows))) << "logits, row " << row;
            torch::Tensor grad = torch::zeros({rows, hidden});
            grad.addmm_(z.t(), x);
            EXPECT_TRUE(torch::equal(grad, whole_grad.narrow(0, row, rows)))
                << "weight gradient, row " << row;
          }
        }
      }
    }
  }
  at::set_num_threads(previous_threads);
}
