// tests/unit/grad_destinations_test.cpp: the products that form weight gradients write them
// into memory offered for them (layers/grad_destinations.h) and autograd adopts that memory
// as .grad() without a copy: LinearProduct, PackedProduct (q|k|v, gate|up) and the fused LM
// head. The values are those of a float64 computation, a later micro-batch adds into the same
// memory, and an offer the product cannot use (weights not one block) changes nothing.
#include "layers/grad_destinations.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "layers/linear_products.h"
#include "layers/parallel_linear.h"
#include "layers/vocab_parallel.h"

namespace retort::layers {
namespace {

constexpr double kTol = 1e-5;

// A buffer poisoned with NaN: any element of the gradient not written by the product shows.
torch::Tensor poisoned(int64_t n) {
  return torch::full({n}, std::numeric_limits<float>::quiet_NaN());
}

bool close64(const torch::Tensor& a, const torch::Tensor& reference) {
  return torch::allclose(a.to(torch::kDouble), reference, kTol, kTol);
}

TEST(GradDestinations, LinearProductFormsTheWeightGradientInTheOfferedMemory) {
  torch::manual_seed(11);
  const torch::Tensor w = (torch::randn({48, 32}) * 0.1).requires_grad_(true);
  const torch::Tensor buffer = poisoned(8 + w.numel());
  // Offered as a temporary: autograd adopts a gradient only when nobody else holds it.
  RunContext run;
  run.gradients.offer(w, buffer.narrow(0, 8, w.numel()).view(w.sizes()));
  const void* offered = buffer.narrow(0, 8, 1).data_ptr();
  torch::Tensor reference = torch::zeros({48, 32}, torch::kDouble);
  for (int micro = 0; micro < 2; ++micro) {  // the second adds into the same memory
    const torch::Tensor x = torch::randn({3, 20, 32}).requires_grad_(true);
    const torch::Tensor dy = torch::randn({3, 20, 48});
    LinearProduct::apply(x, w, &run).backward(dy);
    reference += dy.to(torch::kDouble)
                     .reshape({-1, 48})
                     .t()
                     .matmul(x.detach().to(torch::kDouble).reshape({-1, 32}));
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad().data_ptr(), offered) << "micro-batch " << micro;
    EXPECT_TRUE(close64(w.grad(), reference)) << "micro-batch " << micro;
  }
  EXPECT_TRUE(torch::isnan(buffer.narrow(0, 0, 8)).all().item<bool>()) << "wrote outside";
  EXPECT_FALSE(run.gradients.take(w).defined()) << "the offer was taken once";
}

// Three column layers packed as q|k|v are: their weights' places in an offered block, in
// stacking order, receive the gradient from one product; out of order, the product keeps its
// own memory and the offers stay.
TEST(GradDestinations, PackedProductFillsOneBlockInStackingOrder) {
  torch::manual_seed(12);
  ParameterStore store(5, torch::kFloat);
  const TensorParallel tp;
  ColumnParallelLinear a({"a", 16, 24}, store, tp), b({"b", 16, 8}, store, tp),
      c({"c", 16, 8}, store, tp);
  place_adjacent({&a, &b, &c});
  const std::vector<torch::Tensor> weights{a.weight(), b.weight(), c.weight()};
  RunContext run;
  for (const bool in_order : {true, false}) {
    SCOPED_TRACE(in_order ? "offers in stacking order" : "offers out of order");
    for (const torch::Tensor& w : weights) w.mutable_grad().reset();
    const torch::Tensor block = poisoned(40 * 16);
    // In order: a, b, c one after another. Out of order: b's place before a's.
    const std::vector<int64_t> offsets = in_order ? std::vector<int64_t>{0, 24 * 16, 32 * 16}
                                                  : std::vector<int64_t>{8 * 16, 0, 32 * 16};
    for (size_t i = 0; i < weights.size(); ++i)
      run.gradients.offer(weights[i],
                          block.narrow(0, offsets[i], weights[i].numel()).view(weights[i].sizes()));
    const torch::Tensor x = torch::randn({2, 5, 16}).requires_grad_(true);
    const torch::Tensor dy = torch::randn({2, 5, 40});
    packed_column_forward({&a, &b, &c}, x, &run).backward(dy);
    const torch::Tensor dw64 = dy.to(torch::kDouble)
                                   .reshape({10, 40})
                                   .t()
                                   .matmul(x.detach().to(torch::kDouble).reshape({10, 16}));
    int64_t row = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      const torch::Tensor& g = weights[i].grad();
      EXPECT_TRUE(close64(g, dw64.narrow(0, row, weights[i].size(0)))) << "weight " << i;
      row += weights[i].size(0);
      const void* offered = block.narrow(0, offsets[i], 1).data_ptr();
      if (in_order)
        EXPECT_EQ(g.data_ptr(), offered) << "weight " << i;
      else
        EXPECT_NE(g.data_ptr(), offered) << "weight " << i;
    }
    EXPECT_EQ(in_order, bool(torch::isnan(block).sum().item<int64_t>() == 0));
    for (const torch::Tensor& w : weights) run.gradients.withdraw(w);
  }
}

// The fused LM head forms its weight's gradient in forward: in the offered memory.
TEST(GradDestinations, FusedHeadFormsItsWeightGradientInTheOfferedMemory) {
  torch::manual_seed(13);
  const int64_t vocab = 50, padded = 56, hidden = 24, tokens = 30;
  const torch::Tensor w = (torch::randn({padded, hidden}) * 0.2).requires_grad_(true);
  const torch::Tensor memory = poisoned(w.numel());
  RunContext run;
  run.gradients.offer(w, memory.view(w.sizes()));
  const torch::Tensor x = torch::randn({tokens, hidden}).requires_grad_(true);
  const torch::Tensor targets = torch::randint(0, vocab, {tokens});
  KernelPolicy kernels;
  kernels.run = &run;
  fused_head_cross_entropy_sum(x, w, targets, vocab, TensorParallel(), 8, nullptr, kernels)
      .backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().data_ptr(), memory.data_ptr());
  // float64: d/dW of sum over tokens of cross-entropy on the real vocabulary rows.
  const torch::Tensor x64 = x.detach().to(torch::kDouble), w64 = w.detach().to(torch::kDouble);
  const torch::Tensor p = torch::softmax(x64.matmul(w64.narrow(0, 0, vocab).t()), 1);
  const torch::Tensor dz = p - torch::one_hot(targets, vocab).to(torch::kDouble);
  torch::Tensor dw64 = torch::zeros({padded, hidden}, torch::kDouble);
  dw64.narrow(0, 0, vocab).copy_(dz.t().matmul(x64));
  EXPECT_TRUE(close64(w.grad(), dw64));
}

}  // namespace
}  // namespace retort::layers
