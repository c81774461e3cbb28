// tests/unit/mixed_precision_test.cpp: bf16 mixed precision (model.dtype: bfloat16) at the layer
// level. The compute copies of float32 main weights follow every change of those weights (an
// in-place write, an AdamW step) and are cast once between changes; a model with float32 main
// weights computing in bf16 gives the loss and gradients of the same model in float64 within a
// bound derived from bf16's unit round-off, and its gradients arrive in float32 on the main
// weights.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "engine/observe/memory_tracker.h"
#include "engine/optim/adamw.h"
#include "layers/compute_copy.h"
#include "layers/functional.h"
#include "layers/fused_ops.h"
#include "layers/model.h"

using namespace retort;
using namespace retort::layers;

namespace {

constexpr double kUnitRoundOff = 1.0 / 256;  // bf16: 8 significant bits, round to nearest

bool same_values(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && torch::equal(a, b);
}

TEST(MixedPrecision, ComputeCopyFollowsEveryChangeOfTheMainWeight) {
  ParameterStore store(5, torch::kFloat);
  ParamSpec spec{"w", {48, 32}, 0};
  const torch::Tensor w = store.create(spec);
  ComputeCopies copies;  // a run's
  const torch::Tensor first = copies.weight_in(w, torch::kBFloat16);
  EXPECT_TRUE(same_values(first, w.detach().to(torch::kBFloat16)));
  // Cast once: the second use gets the same copy.
  EXPECT_EQ(copies.weight_in(w, torch::kBFloat16).data_ptr(), first.data_ptr());
  EXPECT_EQ(copies.weight_in(w, torch::kFloat).data_ptr(), w.data_ptr());  // its own type: itself
  {
    torch::NoGradGuard no_grad;
    w.add_(1.0);
  }
  const torch::Tensor after_write = copies.weight_in(w, torch::kBFloat16);
  EXPECT_TRUE(same_values(after_write, w.detach().to(torch::kBFloat16)));
  EXPECT_FALSE(torch::equal(after_write, first));  // the old copy is left as it was
  // ATen's fused AdamW writes without counting the write; the optimizer counts it.
  engine::OptimizerConfig config;
  engine::AdamW adamw(store, config);
  w.mutable_grad() = torch::randn_like(w);
  adamw.step(0.1);
  const torch::Tensor after_step = copies.weight_in(w, torch::kBFloat16);
  EXPECT_TRUE(same_values(after_step, w.detach().to(torch::kBFloat16)));
  EXPECT_FALSE(torch::equal(after_step, after_write));
  // Stacked weights: one copy of the stack, cast again when any of them changes.
  ParamSpec spec2{"w2", {16, 32}, 0};
  const torch::Tensor w2 = store.create(spec2);
  const torch::Tensor stack = copies.stacked_weights_in({w, w2}, torch::kBFloat16);
  EXPECT_TRUE(same_values(stack, torch::cat({w, w2}).detach().to(torch::kBFloat16)));
  {
    torch::NoGradGuard no_grad;
    w2.mul_(-1.0);
  }
  EXPECT_TRUE(same_values(copies.stacked_weights_in({w, w2}, torch::kBFloat16),
                          torch::cat({w, w2}).detach().to(torch::kBFloat16)));
}

// A weight's stale copy is let go before its new copy is cast, so a step's first use (the LM
// head's, at the end of forward, where memory peaks) never holds two copies of one weight.
TEST(MixedPrecision, ComputeCopyOfAChangedWeightIsNotHeldTwiceWhileCast) {
  engine::MemoryTracker& tracker = engine::MemoryTracker::install();
  ParameterStore store(6, torch::kFloat);
  const torch::Tensor w = store.create(ParamSpec{"head", {256, 64}, 0});
  const int64_t copy_bytes = 256 * 64 * 2;
  ComputeCopies copies;
  copies.weight_in(w, torch::kBFloat16);  // cached; no other holder
  {
    torch::NoGradGuard no_grad;
    w.add_(1.0);
  }
  const int64_t before = tracker.current_split().of(MemoryCategory::compute_weights);
  ASSERT_GE(before, copy_bytes);  // the stale copy, still cached
  tracker.reset_peak();
  const torch::Tensor fresh = copies.weight_in(w, torch::kBFloat16);
  EXPECT_TRUE(same_values(fresh, w.detach().to(torch::kBFloat16)));
  EXPECT_EQ(tracker.peak_split().of(MemoryCategory::compute_weights), before);
  EXPECT_EQ(tracker.current_split().of(MemoryCategory::compute_weights), before);
}

// |got - exact| <= 2^-8 |exact| + floor per element: one rounding to bf16 (half an ulp, 2^-9
// relative) of a float32 result whose own error is far smaller; floor covers the float32 error
// of results that cancel to near zero (scaled to the largest exact value).
void expect_rounded_once(const torch::Tensor& got, const torch::Tensor& exact, const char* what) {
  ASSERT_EQ(got.scalar_type(), torch::kBFloat16) << what;
  const torch::Tensor error = (got.to(torch::kDouble) - exact).abs();
  const torch::Tensor allowed = exact.abs() * kUnitRoundOff + 1e-5 * exact.abs().max();
  EXPECT_TRUE((error <= allowed).all().item<bool>())
      << what << ": worst excess " << (error - allowed).max().item<double>();
}

TEST(MixedPrecision, BFloat16RowLoopsRoundFloat64ResultsOnce) {
  torch::manual_seed(11);
  const auto bf16 = torch::kBFloat16;
  const torch::Tensor x = torch::randn({3, 16, 64}).to(bf16).requires_grad_();
  const torch::Tensor w =
      (1 + 0.1 * torch::randn({64})).to(bf16).to(torch::kFloat).requires_grad_();
  const torch::Tensor dy = torch::randn({3, 16, 64}).to(bf16);
  // RMSNorm of bf16 rows, and of a float32 stream into bf16.
  for (const torch::ScalarType stream : {bf16, torch::kFloat}) {
    const torch::Tensor xs = x.detach().to(stream).requires_grad_();
    const torch::Tensor y = fused_rms_norm(xs, w, 1e-5, bf16);
    y.backward(dy);
    const torch::Tensor x64 = xs.detach().to(torch::kDouble).requires_grad_();
    const torch::Tensor w64 = w.detach().to(torch::kDouble).requires_grad_();
    const torch::Tensor y64 = x64 * torch::rsqrt(x64.pow(2).mean(-1, true) + 1e-5) * w64;
    y64.backward(dy.to(torch::kDouble));
    expect_rounded_once(y, y64, "rms_norm forward");
    expect_rounded_once(xs.grad().to(bf16), x64.grad(), "rms_norm input gradient");
    EXPECT_EQ(xs.grad().scalar_type(), stream);
    EXPECT_LE((w.grad().to(torch::kDouble) - w64.grad()).abs().max().item<double>(),
              1e-5 * w64.grad().abs().max().item<double>());  // summed in float32
    w.mutable_grad() = torch::Tensor();
  }
  // SwiGLU on packed bf16 gate|up.
  const torch::Tensor gate_up = torch::randn({2, 16, 2 * 48}).to(bf16).requires_grad_();
  const torch::Tensor out = fused_swiglu_packed(gate_up);
  const torch::Tensor d_out = torch::randn({2, 16, 48}).to(bf16);
  out.backward(d_out);
  const torch::Tensor g64 = gate_up.detach().to(torch::kDouble).requires_grad_();
  const torch::Tensor out64 = torch::silu(g64.narrow(-1, 0, 48)) * g64.narrow(-1, 48, 48);
  out64.backward(d_out.to(torch::kDouble));
  expect_rounded_once(out, out64, "swiglu forward");
  expect_rounded_once(gate_up.grad(), g64.grad(), "swiglu gradient");
  // RoPE in place on bf16 rows by float32 tables.
  auto [cos, sin] = rope_tables(16, 32, 10000.0, 0, torch::dtype(torch::kFloat));
  const torch::Tensor q = torch::randn({2, 16, 4 * 32}).to(bf16);
  const torch::Tensor rotated = fused_rope_(q.clone(), cos, sin);
  const torch::Tensor per_head = q.to(torch::kDouble).view({2, 16, 4, 32}).transpose(1, 2);
  const torch::Tensor rotated64 =
      apply_rope(per_head, cos.to(torch::kDouble), sin.to(torch::kDouble)).transpose(1, 2);
  expect_rounded_once(rotated, rotated64.reshape({2, 16, 128}), "rope");
}

ModelConfig small_model() {
  ModelConfig c;
  c.vocab_size = 256;
  c.hidden = 64;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 172;
  c.layer_windows = {0, 8};  // a full and a sliding-window layer
  c.init_std = 0.2;          // logits well away from uniform, so the loss has digits to lose
  return c;
}

// Residual stream in bf16 or in float32.
class BFloat16Compute : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(BFloat16Compute, MatchesFloat64WithinTheDerivedBound) {
  const ModelConfig config = small_model();
  ParameterStore main(7, torch::kFloat), exact(7, torch::kDouble);
  LlamaModel mixed(config, main), reference(config, exact);
  mixed.set_types(torch::kBFloat16, GetParam());
  torch::manual_seed(3);
  const torch::Tensor tokens = torch::randint(0, config.vocab_size, {2, 32}, torch::kLong);
  const torch::Tensor targets = torch::randint(0, config.vocab_size, {2, 32}, torch::kLong);
  const torch::Tensor loss = mixed.loss_sum(tokens, targets) / 64;
  const torch::Tensor loss_exact = reference.loss_sum(tokens, targets) / 64;
  loss.backward();
  loss_exact.backward();
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);  // the loss is summed in float32
  // The bound, to first order in u: every rounding to bf16 on the way from the weights to the
  // logits changes what it rounds by at most u relatively, and the blocks (normalised, with
  // residual connections) do not amplify a relative change. A block rounds at most 10 times on
  // that path (its two norms, four product outputs, attention output, SwiGLU, two residual sums),
  // the embedding, final norm and head 3 more: logits within R = 10 L + 3 roundings, and the
  // cross-entropy (1-Lipschitz in each logit per token) within R u max|logit|. Backward runs
  // the same products transposed, as many roundings again: each gradient within 2 R u of its
  // norm.
  const double roundings = 10.0 * config.layers + 3;
  const double max_logit = reference.forward(tokens).abs().max().item<double>();
  EXPECT_LE(std::abs(loss.item<double>() - loss_exact.item<double>()),
            roundings * kUnitRoundOff * max_logit);
  for (const Parameter& p : main.all()) {
    const Parameter* q = exact.find(p.spec.name);
    ASSERT_TRUE(p.value.grad().defined()) << p.spec.name;
    EXPECT_EQ(p.value.grad().scalar_type(), torch::kFloat) << p.spec.name;  // main gradients
    const double error =
        (p.value.grad().to(torch::kDouble) - q->value.grad()).norm().item<double>();
    const double size = q->value.grad().norm().item<double>();
    EXPECT_LE(error, 2 * roundings * kUnitRoundOff * size) << p.spec.name;
  }
}

INSTANTIATE_TEST_SUITE_P(MixedPrecision, BFloat16Compute,
                         ::testing::Values(torch::kBFloat16, torch::kFloat));

}  // namespace
