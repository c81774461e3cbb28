// tests/unit/schedule_optimizer_test.cpp: the LR schedule against its formulas, and one
// AdamW step against a hand computation in double precision; frozen parameters get no state.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "engine/optim/adamw.h"
#include "engine/optim/lr_schedule.h"

using namespace retort;
using namespace retort::engine;

namespace {

// beta1 0.9 and weight decay 0.1, as the hand computations below assume.
OptimizerConfig adam_config(double beta2, double eps) {
  OptimizerConfig config;
  config.beta1 = 0.9;
  config.beta2 = beta2;
  config.eps = eps;
  config.weight_decay = 0.1;
  return config;
}

}  // namespace

TEST(LrSchedule, WarmupThenDecay) {
  LrSchedule s{1.0, 0.1, LrShape::cosine, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.1 + 0.9 * 0.5, 1e-12);  // halfway down the cosine
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  s.shape = LrShape::linear;
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.75, 1e-12);
  s.shape = LrShape::constant;
  EXPECT_DOUBLE_EQ(s.at(80), 1.0);
}

TEST(AdamW, OneStepMatchesHandComputation) {
  layers::ParameterStore store(1, torch::kDouble);
  layers::ParamSpec w{"w", {3}, -1};
  layers::ParamSpec frozen{"f", {2}, -1};
  frozen.lr_scale = 0;
  torch::Tensor value = store.create(w);
  store.create(frozen);
  const OptimizerConfig config = adam_config(0.99, 1e-8);
  AdamW adam(store, config);
  EXPECT_FALSE(adam.states()[1].exp_avg.defined());  // no state for the frozen parameter
  EXPECT_EQ(adam.state_bytes(), 2 * 3 * 8);

  torch::Tensor before = value.detach().clone();
  torch::Tensor grad = torch::tensor({0.5, -1.0, 2.0}, torch::kDouble);
  value.mutable_grad() = grad.clone();
  adam.step(0.01);
  for (int i = 0; i < 3; ++i) {
    const double p = before[i].item<double>(), g = grad[i].item<double>();
    const double m = 0.1 * g, v = 0.01 * g * g;
    const double m_hat = m / 0.1, v_hat = v / 0.01;
    const double expected = p * (1 - 0.01 * 0.1) - 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8);
    EXPECT_NEAR(value[i].item<double>(), expected, 1e-15);
  }
}

// A parameter larger than AdamW's slice (2^18 elements) is stepped slice by slice: every
// element, including the last slice's, follows the formula over two steps.
TEST(AdamW, LargeParameterStepsEveryElementTwice) {
  layers::ParameterStore store(3, torch::kDouble);
  const int64_t rows = 1100, cols = 512;  // 563200 elements: two full slices and a part
  torch::Tensor value = store.create({"big", {rows, cols}, -1});
  const OptimizerConfig config = adam_config(0.95, 1e-6);
  AdamW adam(store, config);
  torch::Tensor p = value.detach().clone(), m = torch::zeros_like(p), v = torch::zeros_like(p);
  for (int step = 1; step <= 2; ++step) {
    torch::Tensor g = torch::randn({rows, cols}, torch::kDouble);
    value.mutable_grad() = g.clone();
    adam.step(0.01);
    p = p * (1 - 0.01 * 0.1);
    m = 0.9 * m + 0.1 * g;
    v = 0.95 * v + 0.05 * g * g;
    const double b1 = 1 - std::pow(0.9, step), b2 = 1 - std::pow(0.95, step);
    p = p - 0.01 * (m / b1) / ((v / b2).sqrt() + 1e-6);
  }
  EXPECT_LT((value - p).abs().max().item<double>(), 1e-13);
}

// Optimizer-in-backward steps the LM head weight in blocks of rows, keeping some rows out of
// a block and stepping them later as a list: every row still follows the formula once a step.
TEST(AdamW, RowBlocksAndRowListsStepEveryRowOnce) {
  layers::ParameterStore store(4, torch::kDouble);
  const int64_t rows = 7, cols = 3;
  torch::Tensor value = store.create({"w", {rows, cols}, -1});
  const OptimizerConfig config = adam_config(0.95, 1e-6);
  AdamW adam(store, config);
  torch::Tensor p = value.detach().clone(), m = torch::zeros_like(p), v = torch::zeros_like(p);
  const torch::Tensor skipped = torch::tensor({1, 5}, torch::kLong);  // whole-parameter rows
  for (int step = 1; step <= 2; ++step) {
    torch::Tensor g = torch::randn({rows, cols}, torch::kDouble);
    adam.begin_step();
    // Blocks [0, 4) and [4, 7), each without its skipped row (block-relative 1 and 1).
    adam.step_rows(0, 0, g.narrow(0, 0, 4).clone(), 0.01, torch::tensor({1}, torch::kLong));
    adam.step_rows(0, 4, g.narrow(0, 4, 3).clone(), 0.01, torch::tensor({1}, torch::kLong));
    adam.step_row_list(0, skipped, g.index_select(0, skipped), 0.01);
    p = p * (1 - 0.01 * 0.1);
    m = 0.9 * m + 0.1 * g;
    v = 0.95 * v + 0.05 * g * g;
    const double b1 = 1 - std::pow(0.9, step), b2 = 1 - std::pow(0.95, step);
    p = p - 0.01 * (m / b1) / ((v / b2).sqrt() + 1e-6);
  }
  EXPECT_LT((value - p).abs().max().item<double>(), 1e-13);
  EXPECT_LT((adam.states()[0].exp_avg_sq - v).abs().max().item<double>(), 1e-15);
}

TEST(AdamW, ClipScalesToMaxNorm) {
  layers::ParameterStore store(1, torch::kDouble);
  torch::Tensor a = store.create({"a", {2}, -1});
  torch::Tensor b = store.create({"b", {1}, -1});
  a.mutable_grad() = torch::tensor({3.0, 0.0}, torch::kDouble);
  b.mutable_grad() = torch::tensor({4.0}, torch::kDouble);
  EXPECT_DOUBLE_EQ(clip_grad_norm(store, 1.0), 5.0);
  EXPECT_NEAR(global_grad_norm(store), 1.0, 1e-6);
}

// A gradient that is not contiguous (a transposed view) steps exactly as its contiguous copy
// does: ATen's fused AdamW reads raw buffers, so AdamW hands it a contiguous gradient.
TEST(AdamW, StridedGradientStepsLikeItsContiguousCopy) {
  layers::ParameterStore store(5, torch::kDouble);
  torch::Tensor flat = store.create({"flat", {4, 3}, -1});
  torch::Tensor strided = store.create({"strided", {4, 3}, -1});
  {
    torch::NoGradGuard no_grad;
    strided.copy_(flat);
  }
  const OptimizerConfig config = adam_config(0.95, 1e-6);
  AdamW adam(store, config);
  torch::Tensor g = torch::randn({4, 3}, torch::kDouble);
  flat.mutable_grad() = g.clone();
  strided.mutable_grad() = g.t().contiguous().t();  // same values, not contiguous
  ASSERT_FALSE(strided.grad().is_contiguous());
  const torch::Tensor before = flat.detach().clone();
  adam.step(0.01);
  const torch::Tensor m = 0.1 * g, v = 0.05 * g * g;
  const torch::Tensor expected =
      before * (1 - 0.01 * 0.1) - 0.01 * (m / 0.1) / ((v / 0.05).sqrt() + 1e-6);
  EXPECT_LT((flat - expected).abs().max().item<double>(), 1e-14);
  EXPECT_TRUE(torch::equal(strided, flat));
  EXPECT_TRUE(torch::equal(adam.states()[1].exp_avg_sq, adam.states()[0].exp_avg_sq));
}
