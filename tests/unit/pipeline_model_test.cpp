// tests/unit/pipeline_model_test.cpp: the model split into pipeline stages against the
// whole model (the plain un-split reference, same seed): each stage holds only its layers,
// the embedding on the first and norm and head on the last; chaining the stages gives the
// whole model's loss and, parameter by parameter, its gradients. With tied embeddings the
// last stage holds a tied copy whose gradient plus the first stage's equals the whole
// model's embedding gradient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "layers/model.h"
#include "parallel/pipeline_partition.h"

using namespace retort::layers;

namespace {

ModelConfig small_model(bool tied) {
  ModelConfig c;
  c.vocab_size = 96;
  c.hidden = 32;
  c.layers = 5;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_hidden = 64;
  c.tied_embeddings = tied;
  c.layer_windows = {0, 6, 0, 6, 0};
  return c;
}

struct StagedModel {
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<std::unique_ptr<LlamaModel>> stages;
};

StagedModel split(const ModelConfig& c, const std::vector<int64_t>& counts) {
  StagedModel m;
  auto ranges = retort::parallel::split_layers(c.layers, int(counts.size()), counts);
  for (size_t s = 0; s < ranges.size(); ++s) {
    m.stores.push_back(std::make_unique<ParameterStore>(5, torch::kDouble));
    ModelStage stage{ranges[s].first, ranges[s].end, s == 0, s + 1 == ranges.size()};
    m.stages.push_back(std::make_unique<LlamaModel>(c, *m.stores.back(), TensorParallel{}, stage));
  }
  return m;
}

void check_stages_match_whole_model(bool tied) {
  const ModelConfig c = small_model(tied);
  ParameterStore whole_store(5, torch::kDouble);
  LlamaModel whole(c, whole_store);
  StagedModel staged = split(c, {1, 2, 2});

  torch::manual_seed(0);
  torch::Tensor tokens = torch::randint(c.vocab_size, {2, 12}, torch::kLong);
  torch::Tensor targets = torch::randint(c.vocab_size, {2, 12}, torch::kLong);
  torch::Tensor reference = whole.loss_sum(tokens, targets);
  reference.backward();

  torch::Tensor x = staged.stages[0]->embed(tokens);
  for (auto& stage : staged.stages) x = stage->run_blocks(x, tokens.size(1), nullptr);
  torch::Tensor loss = staged.stages.back()->head_loss_sum(x, targets);
  loss.backward();
  EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-10);

  // Every parameter lives on exactly one stage (a tied copy aside), with the same gradient.
  size_t seen = 0;
  for (auto& store : staged.stores)
    for (auto& p : store->all()) {
      const Parameter* ref = whole_store.find(p.spec.name);
      ASSERT_NE(ref, nullptr) << p.spec.name;
      if (p.spec.tied_copy) continue;
      ++seen;
      torch::Tensor grad = p.value.grad();
      if (tied && p.spec.name == "embed.weight")
        grad = grad + staged.stores.back()->find("embed.weight")->value.grad();
      EXPECT_TRUE(torch::allclose(p.value, ref->value)) << p.spec.name;
      EXPECT_TRUE(torch::allclose(grad, ref->value.grad(), 1e-9, 1e-12)) << p.spec.name;
    }
  EXPECT_EQ(seen, whole_store.all().size());
}

}  // namespace

TEST(PipelineModel, StagesChainToTheWholeModelUntied) {
  check_stages_match_whole_model(false);
}

TEST(PipelineModel, StagesChainToTheWholeModelTied) {
  check_stages_match_whole_model(true);
}

TEST(PipelineModel, StagesHoldOnlyTheirParts) {
  StagedModel staged = split(small_model(true), {1, 2, 2});
  auto names = [](const ParameterStore& s) {
    std::set<std::string> n;
    for (const auto& p : s.all()) n.insert(p.spec.name);
    return n;
  };
  auto first = names(*staged.stores[0]), middle = names(*staged.stores[1]),
       last = names(*staged.stores[2]);
  EXPECT_TRUE(first.count("embed.weight"));
  EXPECT_TRUE(first.count("layers.0.attn.q_proj.weight"));
  EXPECT_FALSE(first.count("layers.1.attn.q_proj.weight"));
  EXPECT_FALSE(first.count("final_norm.weight"));
  EXPECT_TRUE(middle.count("layers.1.mlp.up_proj.weight"));
  EXPECT_TRUE(middle.count("layers.2.mlp.up_proj.weight"));
  EXPECT_FALSE(middle.count("embed.weight"));
  EXPECT_TRUE(last.count("final_norm.weight"));
  EXPECT_TRUE(last.count("embed.weight"));  // the tied copy
  EXPECT_TRUE(staged.stores[2]->find("embed.weight")->spec.tied_copy);
  EXPECT_FALSE(staged.stores[0]->find("embed.weight")->spec.tied_copy);
  EXPECT_TRUE(torch::equal(staged.stores[2]->find("embed.weight")->value,
                           staged.stores[0]->find("embed.weight")->value));
}
