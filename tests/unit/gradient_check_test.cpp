// tests/unit/gradient_check_test.cpp: autograd gradients of the normalised loss against
// central finite differences in double precision, on a tiny model that uses every feature
// (GQA, sliding window, qkv bias, tied embeddings, ignored targets, the fused chunked LM head
// with gradients formed in forward).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "layers/model.h"

using namespace retort::layers;

TEST(GradientCheck, AutogradMatchesFiniteDifferences) {
  ModelConfig c;
  c.vocab_size = 24;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 24;
  c.layer_windows = {0, 3};
  c.qkv_bias = true;
  c.tied_embeddings = true;
  c.init_std = 0.3;
  ParameterStore store(11, torch::kDouble);
  LlamaModel model(c, store);
  model.set_head_chunk_tokens(5);  // the fused head in 3 chunks of 12 tokens, the last partial
  torch::Tensor tokens = torch::randint(c.vocab_size, {2, 6}, torch::kLong);
  torch::Tensor targets = torch::randint(c.vocab_size, {2, 6}, torch::kLong);
  targets[1][0] = kIgnoreIndex;
  const double count = double(count_targets(targets));
  auto loss_fn = [&] { return model.loss_sum(tokens, targets) / count; };

  loss_fn().backward();
  const double h = 1e-6;
  int checked = 0;
  for (auto& p : store.all()) {
    torch::Tensor flat = p.value.detach().view({-1});
    torch::Tensor grad = p.value.grad().view({-1});
    // A spread of elements per parameter: first, last and a few in between, among the real
    // entries only (vocabulary padding rows have no gradient to check, and a probe there
    // would pass whatever the code does).
    const int64_t n = p.spec.padded_rows > 0 ? p.spec.numel() : flat.numel();
    for (int64_t idx : {int64_t(0), n / 3, n / 2, (2 * n) / 3, n - 1}) {
      torch::NoGradGuard no_grad;
      const double original = flat[idx].item<double>();
      flat[idx] = original + h;
      const double up = loss_fn().item<double>();
      flat[idx] = original - h;
      const double down = loss_fn().item<double>();
      flat[idx] = original;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grad[idx].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-7 + 1e-5 * std::abs(numeric))
          << p.spec.name << "[" << idx << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}
