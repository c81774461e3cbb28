// tests/unit/linear_products_test.cpp: the linear layers' weight products
// (layers/linear_products.h) against float64 torch: y = x W^T and dx = dy W at shapes the tile
// loops take (rows not a multiple of their 12-row blocks, widths not a multiple of their
// 32-column panels, a 3-D input, a weight that is a row range of a larger one) and at shapes
// the BLAS keeps; dy W with the LM head's long inner dimension, also written into a row range
// of a larger gradient; LinearProduct's gradients for x and W,
// with W frozen, and with the product called while autograd records (it must then fall back,
// not cut the graph).
#include "layers/linear_products.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/dispatch.h"
#include "kernels/tile_gemm.h"

namespace retort::layers {
namespace {

// Largest difference relative to the largest magnitude of the reference.
double relative_error(const torch::Tensor& got, const torch::Tensor& reference) {
  return (got.to(torch::kDouble) - reference).abs().max().item<double>() /
         reference.abs().max().item<double>();
}

// fp32 products of inner dimension up to 1536 of unit-variance values agree with float64 to a
// few 1e-7; 1e-5 leaves room for that and catches any misplaced element or stride.
constexpr double kTolerance = 1e-5;

struct Shape {
  std::vector<int64_t> x;  // input sizes, last = in
  int64_t out;
};

// The dispatch's table (kernels/dispatch.h) for the shapes of the tests below: fp32 products
// of 64-256 rows with an inner dimension of at most 1536 take the tile loops (on AVX-512 CPUs,
// in automatic mode), the rest the BLAS.
TEST(LinearProducts, ShapesThisFileRoutesAreTheOnesTested) {
  if (!kernels::tile_gemm_available() || environment_kernel_mode() == kernels::KernelMode::aten)
    GTEST_SKIP() << "the tile loops do not run here";
  auto tile = [](int64_t rows, int64_t inner) {
    return kernels::route(kernels::Operation::linear_product,
                          {kernels::DeviceKind::cpu, kernels::ElementType::f32, rows, inner},
                          kernels::KernelMode::automatic) == kernels::Route::ours;
  };
  EXPECT_TRUE(tile(250, 64));      // 64-256 rows, inner at most 1536: tile loops
  EXPECT_TRUE(tile(256, 1536));    // the layers' down projection at 256 tokens
  EXPECT_TRUE(tile(192, 512));     // the LM head's chunks, forward
  EXPECT_FALSE(tile(256, 3072));   // gate|up's input gradient: the BLAS
  EXPECT_FALSE(tile(32, 64));      // fewer than 64 rows: the BLAS
  EXPECT_FALSE(tile(1024, 512));   // 1024 tokens: the BLAS
  EXPECT_FALSE(tile(192, 32000));  // the LM head's input gradient: the BLAS
  // Doubles and another device never take them.
  EXPECT_EQ(kernels::route(kernels::Operation::linear_product,
                           {kernels::DeviceKind::cpu, kernels::ElementType::f64, 128, 64},
                           kernels::KernelMode::automatic),
            kernels::Route::aten);
  EXPECT_EQ(kernels::route(kernels::Operation::linear_product,
                           {kernels::DeviceKind::cuda, kernels::ElementType::f32, 128, 64},
                           kernels::KernelMode::automatic),
            kernels::Route::aten);
}

// dy W with an inner dimension as long as a vocabulary (the BLAS), returned and written into rows
// [5, 5 + 300) of a larger gradient, whose other rows stay.
TEST(LinearProducts, LongInnerDimensionInputGradientMatchesFloat64) {
  torch::manual_seed(7);
  const int64_t rows = 300, vocab = 9000, hidden = 72;
  const torch::Tensor dy = torch::randn({rows, vocab});
  const torch::Tensor w = torch::randn({vocab, hidden}) * 0.02;
  const torch::Tensor expected = torch::matmul(dy.to(torch::kDouble), w.to(torch::kDouble));
  EXPECT_LT(relative_error(product_by(dy, w), expected), kTolerance);
  torch::Tensor whole = torch::randn({rows + 9, hidden});
  const torch::Tensor before = whole.clone();
  torch::Tensor range = whole.narrow(0, 5, rows);
  product_by_out(range, dy, w);
  EXPECT_LT(relative_error(whole.narrow(0, 5, rows), expected), kTolerance);
  EXPECT_TRUE(torch::equal(whole.narrow(0, 0, 5), before.narrow(0, 0, 5)));
  EXPECT_TRUE(torch::equal(whole.narrow(0, 5 + rows, 4), before.narrow(0, 5 + rows, 4)));
}

// A TP rank whose slice of a padded vocabulary holds no real id has a [rows, 0] gradient of its
// logits and a [0, hidden] weight: dy W is zeros (the tile route, where it applies, once failed
// to flatten the empty rows).
TEST(LinearProducts, EmptyVocabularySliceGivesZeros) {
  const int64_t rows = 128, hidden = 72;
  const torch::Tensor dy = torch::zeros({rows, 0});
  const torch::Tensor w = torch::zeros({0, hidden});
  const torch::Tensor product = product_by(dy, w);
  ASSERT_EQ(product.sizes(), (std::vector<int64_t>{rows, hidden}));
  EXPECT_EQ(product.abs().max().item<float>(), 0);
  torch::Tensor out = torch::full({rows, hidden}, 3.0);
  product_by_out(out, dy, w);
  EXPECT_EQ(out.abs().max().item<float>(), 0);
  EXPECT_EQ(product_by_transposed(torch::randn({rows, hidden}), w).sizes(),
            (std::vector<int64_t>{rows, 0}));
}

TEST(LinearProducts, ForwardAndInputGradientMatchFloat64) {
  torch::manual_seed(3);
  const std::vector<Shape> shapes = {{{250, 64}, 100},  {{2, 115, 64}, 45}, {{197, 96}, 33},
                                     {{256, 200}, 64},  {{100, 64}, 70},    {{40, 64}, 70},
                                     {{1100, 1500}, 20}};  // the last two: the BLAS
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "x " << torch::IntArrayRef(s.x) << " out " << s.out);
    const int64_t in = s.x.back();
    const torch::Tensor x = torch::randn(s.x);
    // A row range of a larger weight: rows [7, 7 + out) of [out + 20, in].
    const torch::Tensor w = torch::randn({s.out + 20, in}).narrow(0, 7, s.out);
    std::vector<int64_t> y_sizes = s.x;
    y_sizes.back() = s.out;
    const torch::Tensor dy = torch::randn(y_sizes);

    const torch::Tensor y = product_by_transposed(x, w);
    EXPECT_EQ(y.sizes(), torch::IntArrayRef(y_sizes));
    EXPECT_LT(relative_error(y, torch::matmul(x.to(torch::kDouble), w.to(torch::kDouble).t())),
              kTolerance);
    const torch::Tensor dx = product_by(dy, w);
    EXPECT_EQ(dx.sizes(), x.sizes());
    EXPECT_LT(relative_error(dx, torch::matmul(dy.to(torch::kDouble), w.to(torch::kDouble))),
              kTolerance);
  }
}

TEST(LinearProducts, LinearProductGradientsMatchFloat64) {
  torch::manual_seed(4);
  for (const bool weight_trains : {true, false}) {
    SCOPED_TRACE(weight_trains ? "weight trains" : "weight frozen");
    const torch::Tensor x = torch::randn({2, 75, 96}).requires_grad_(true);
    const torch::Tensor w = (torch::randn({80, 96}) * 0.1).requires_grad_(weight_trains);
    const torch::Tensor upstream = torch::randn({2, 75, 80});
    const torch::Tensor y = LinearProduct::apply(x, w, nullptr);
    (y * upstream).sum().backward();

    const torch::Tensor xd = x.detach().to(torch::kDouble), wd = w.detach().to(torch::kDouble),
                        gd = upstream.to(torch::kDouble);
    EXPECT_LT(relative_error(y.detach(), torch::matmul(xd, wd.t())), kTolerance);
    EXPECT_LT(relative_error(x.grad(), torch::matmul(gd, wd)), kTolerance);
    if (weight_trains) {
      EXPECT_LT(
          relative_error(w.grad(), torch::matmul(gd.reshape({-1, 80}).t(), xd.reshape({-1, 96}))),
          kTolerance);
    } else {
      EXPECT_FALSE(w.grad().defined());
    }
  }
}

TEST(LinearProducts, RecordingAutogradFallsBackAndKeepsTheGraph) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({600, 64}).requires_grad_(true);
  const torch::Tensor w = torch::randn({40, 64});
  torch::Tensor y = product_by_transposed(x, w);  // grad mode on, x requires grad
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_LT(
      relative_error(x.grad(), torch::ones({600, 40}, torch::kDouble).matmul(w.to(torch::kDouble))),
      kTolerance);
}

}  // namespace
}  // namespace retort::layers
