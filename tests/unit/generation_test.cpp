// tests/unit/generation_test.cpp: the KV cache against recomputation, in float64. Logits of
// a prompt chunk and then of one token at a time through the cache equal the full forward
// of the whole sequence at every position (within 1e-10); and generated tokens, greedy and
// sampled (temperature, top-k), are the same with the cache as when the whole prefix is
// recomputed for every token, also when a short context makes the window slide.
#include "generation_test.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/generate/generator.h"

using namespace retort;

TEST(Generation, CachedLogitsEqualTheFullForward) {
  torch::NoGradGuard no_grad;
  test::GenerationModel m = test::generation_model();
  torch::manual_seed(3);
  const torch::Tensor tokens = torch::randint(0, 300, {1, 20}, torch::kLong);
  const torch::Tensor full = m.model->forward(tokens).narrow(-1, 0, 300);
  layers::KvCache cache;
  cache.capacity = 20;
  std::vector<torch::Tensor> pieces = {m.model->forward_cached(tokens.narrow(1, 0, 7), cache)};
  for (int64_t i = 7; i < 20; ++i)
    pieces.push_back(m.model->forward_cached(tokens.narrow(1, i, 1), cache));
  const torch::Tensor cached = torch::cat(pieces, 1).narrow(-1, 0, 300);
  EXPECT_EQ(cache.length, 20);
  const double worst = (cached - full).abs().max().item<double>();
  EXPECT_LT(worst, 1e-10) << "cached logits differ from the full forward by " << worst;
  EXPECT_GT(full.std().item<double>(), 0.5);  // logits far from uniform: the test can tell
}

TEST(Generation, CachedTokensEqualRecomputedPrefix) {
  test::GenerationModel m = test::generation_model();
  const std::vector<int64_t> prompt = {5, 17, 250, 3, 99, 42};
  std::vector<int64_t> greedy;
  for (auto [temperature, top_k] : {std::pair{0.0, 0L}, {1.0, 0L}, {0.8, 20L}}) {
    engine::SamplingOptions options;
    options.max_tokens = 40;
    options.temperature = temperature;
    options.top_k = top_k;
    options.seed = 11;
    const std::vector<int64_t> cached = engine::generate(*m.model, prompt, options, true);
    const std::vector<int64_t> recomputed = engine::generate(*m.model, prompt, options, false);
    ASSERT_EQ(cached.size(), 40u);
    EXPECT_EQ(cached, recomputed) << "temperature " << temperature << ", top-k " << top_k;
    if (temperature == 0)
      greedy = cached;
    else
      EXPECT_NE(cached, greedy) << "sampling gave the greedy sequence";
  }
}

TEST(Generation, SlidingContextCachedEqualsRecomputed) {
  test::GenerationModel m = test::generation_model();
  const std::vector<int64_t> prompt = {5, 17, 250, 3, 99, 42, 7, 8, 9, 10, 11, 12};
  engine::SamplingOptions options;
  options.max_tokens = 50;
  options.temperature = 0.9;
  options.seed = 4;
  options.context = 10;  // shorter than the prompt: it is cut, and the window slides often
  const std::vector<int64_t> cached = engine::generate(*m.model, prompt, options, true);
  EXPECT_EQ(cached.size(), 50u);
  EXPECT_EQ(cached, engine::generate(*m.model, prompt, options, false));
  options.context = 0;
  EXPECT_NE(cached, engine::generate(*m.model, prompt, options, true))
      << "the context limit changed nothing";
}
