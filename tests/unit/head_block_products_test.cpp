// tests/unit/head_block_products_test.cpp: what our own tile loops guarantee about a block of
// weight rows. layers/linear_products.h's tile product sums each output element over k in
// k's order, whatever the number of columns, so a product with a block of the weight's rows
// gives bitwise the same columns as the product with all rows. The streamed LM head
// (layers/vocab_parallel.cpp) forms its logits again that way, block of vocabulary rows by
// block. Where the BLAS takes the products instead (float64, RETORT_KERNELS=aten, shapes the
// dispatch keeps for it) no such rule holds: its kernels, and so the order of each sum, are
// chosen by shape and CPU (MKL's float64 kernels on a Zen 4 CPU differ by a block's row
// count), and the tests comparing the streamed head with the plain one hold those products to
// a bound derived from round-off (tests/mpi/memory_exactness_test.cpp), not to bitwise.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/dispatch.h"
#include "layers/kernel_route.h"
#include "layers/linear_products.h"

namespace {

int64_t block_rows(int64_t rows) {
  return std::max<int64_t>(1, (rows + 7) / 8);
}

}  // namespace

TEST(HeadBlockProducts, TileLoopsGiveABlockOfRowsBitwiseTheSameColumnsOfTheWholeProduct) {
  const int previous_threads = at::get_num_threads();
  torch::manual_seed(3);
  int64_t checked = 0;
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (int64_t hidden : {64, 128}) {
      for (int64_t vocab : {128, 256}) {
        for (int64_t tokens : {64, 128, 256}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + " hidden " + std::to_string(hidden) +
                       " vocab " + std::to_string(vocab) + " tokens " + std::to_string(tokens));
          torch::Tensor x = torch::randn({tokens, hidden});
          torch::Tensor w = torch::randn({vocab, hidden}) * 0.1;
          // Only where our loops take the product: the property is theirs.
          if (!retort::layers::runs_our_loops(retort::layers::environment_kernel_mode(),
                                              retort::kernels::Operation::linear_product, x, tokens,
                                              hidden))
            continue;
          torch::Tensor logits = retort::layers::product_by_transposed(x, w);
          const int64_t block = block_rows(vocab);
          for (int64_t row = 0; row < vocab; row += block) {
            const int64_t rows = std::min(block, vocab - row);
            torch::Tensor z = retort::layers::product_by_transposed(x, w.narrow(0, row, rows));
            EXPECT_TRUE(torch::equal(z, logits.narrow(1, row, rows))) << "logits, row " << row;
          }
          ++checked;
        }
      }
    }
  }
  at::set_num_threads(previous_threads);
  if (checked == 0) GTEST_SKIP() << "the dispatch sends none of these products to the tile loops";
}
