// tests/unit/widened_products_test.cpp: bf16 products through layers/widened_products.h, in
// whichever form this process uses (CTest runs these once with the CPU's choice and once with
// RETORT_BF16_PRODUCTS=widened forced). Against float64 products of the same bf16 operands:
// both forms sum in float32 and round once to bf16, so each element is within
//   u16 |exact| + (1 + u16) gamma_k sum_i |a_i b_i|,   u16 = 2^-8, gamma_k = k u32 / (1 - k u32),
// u32 = 2^-24 (a float32 sum of k products, each exact in float32, then one bf16 rounding),
// into a float32 output too (bitwise the bf16 product widened). Gradients through
// matmul_widening (autograd) are held to the same bound per product.
#include "layers/widened_products.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace {

using retort::layers::add_mm_widening;
using retort::layers::matmul_widening;
using retort::layers::mm_out_widening;

constexpr double kU16 = 1.0 / 256, kU32 = 1.0 / (1 << 24);

// The bound above for out = a b, a [m, k], b [k, n], both bf16, in float64.
torch::Tensor bound_for(const torch::Tensor& a, const torch::Tensor& b, bool rounded_to_bf16) {
  const torch::Tensor a64 = a.to(torch::kDouble), b64 = b.to(torch::kDouble);
  const double k = double(a.size(-1)), gamma = k * kU32 / (1 - k * kU32);
  const torch::Tensor exact = torch::matmul(a64, b64);
  const torch::Tensor magnitudes = torch::matmul(a64.abs(), b64.abs());
  return (rounded_to_bf16 ? kU16 * exact.abs() : torch::zeros_like(exact)) +
         (1 + kU16) * gamma * magnitudes;
}

bool within(const torch::Tensor& got, const torch::Tensor& exact, const torch::Tensor& bound) {
  return ((got.to(torch::kDouble) - exact).abs() <= bound).all().item<bool>();
}

}  // namespace

TEST(WidenedProducts, Bf16ProductIsTheFloat32SumRoundedOnce) {
  torch::manual_seed(11);
  for (int64_t k : {16, 300, 1024}) {
    const torch::Tensor a = torch::randn({37, k}).to(torch::kBFloat16);
    const torch::Tensor b = torch::randn({k, 23}).to(torch::kBFloat16);
    const torch::Tensor exact = torch::matmul(a.to(torch::kDouble), b.to(torch::kDouble));
    const torch::Tensor c = matmul_widening(a, b);
    EXPECT_EQ(c.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(within(c, exact, bound_for(a, b, true))) << "k " << k;
    // Batched, and with a transposed operand, as attention and the heads call it.
    const torch::Tensor batched = matmul_widening(a.unsqueeze(0).expand({3, 37, k}), b);
    EXPECT_TRUE(within(batched[2], exact, bound_for(a, b, true))) << "batched, k " << k;
    const torch::Tensor bt = b.t().contiguous();
    EXPECT_TRUE(within(matmul_widening(a, bt.t()), exact, bound_for(a, b, true)));
    // Into a float32 output (a gradient): rounded to bf16 once, as autograd's bf16 product.
    torch::Tensor out = torch::empty({37, 23});
    mm_out_widening(out, a, b);
    EXPECT_TRUE(within(out, exact, bound_for(a, b, true)));
    EXPECT_TRUE(torch::equal(out, c.to(torch::kFloat))) << "k " << k;
    // out += a b into float32 and into bf16.
    torch::Tensor sum32 = torch::ones({37, 23});
    add_mm_widening(sum32, a, b);
    EXPECT_TRUE(within(sum32 - 1, exact, bound_for(a, b, true) + kU32 * 4)) << "k " << k;
    torch::Tensor sum16 = torch::ones({37, 23}).to(torch::kBFloat16);
    add_mm_widening(sum16, a, b);
    EXPECT_TRUE(within(sum16, exact + 1, bound_for(a, b, true) + kU16 * (exact + 1).abs()))
        << "k " << k;
  }
}

TEST(WidenedProducts, GradientsFlowThroughTheWidenedProduct) {
  torch::manual_seed(12);
  const torch::Tensor a0 = torch::randn({19, 64}).to(torch::kBFloat16);
  const torch::Tensor b0 = torch::randn({64, 29}).to(torch::kBFloat16);
  const torch::Tensor g = torch::randn({19, 29}).to(torch::kBFloat16);
  torch::Tensor a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  matmul_widening(a, b).backward(g);
  ASSERT_TRUE(a.grad().defined() && b.grad().defined());
  EXPECT_EQ(a.grad().scalar_type(), torch::kBFloat16);
  // d/da = g b^T, d/db = a^T g: each a product of bf16 values, so held to the same bound.
  const torch::Tensor bt = b0.t().contiguous(), at = a0.t().contiguous();
  EXPECT_TRUE(within(a.grad(), torch::matmul(g.to(torch::kDouble), bt.to(torch::kDouble)),
                     bound_for(g, bt, true)));
  EXPECT_TRUE(within(b.grad(), torch::matmul(at.to(torch::kDouble), g.to(torch::kDouble)),
                     bound_for(at, g, true)));
}

TEST(WidenedProducts, OtherTypesAreTorchsOwnProduct) {
  torch::manual_seed(13);
  for (auto type : {torch::kFloat, torch::kDouble}) {
    const torch::Tensor a = torch::randn({8, 16}, type), b = torch::randn({16, 4}, type);
    EXPECT_TRUE(torch::equal(matmul_widening(a, b), torch::matmul(a, b)));
  }
}
