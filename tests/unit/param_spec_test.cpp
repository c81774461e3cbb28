// tests/unit/param_spec_test.cpp: a parameter's initial value depends only on (seed, global
// name), is produced at global shape and sliced per TP rank; specs carry the right metadata.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "layers/model.h"

using namespace retort::layers;

TEST(ParamSpec, InitialValueDependsOnlyOnSeedAndName) {
  ParamSpec a{"layers.0.attn.q_proj.weight", {8, 4}, 0};
  // Same name and shape, everything else different: the value must not change.
  ParamSpec b = a;
  b.shard_dim = 1;
  b.sequence_replicated = true;
  b.tp_partial_grad = true;
  b.lr_scale = 0.25;
  b.weight_decay = false;
  EXPECT_TRUE(torch::equal(initial_global_value(a, 5), initial_global_value(b, 5)));
  EXPECT_FALSE(torch::equal(initial_global_value(a, 5), initial_global_value(a, 6)));
  ParamSpec other = a;
  other.name = "layers.1.attn.q_proj.weight";
  EXPECT_FALSE(torch::equal(initial_global_value(a, 5), initial_global_value(other, 5)));
}

TEST(ParamSpec, ModelInitialisationIndependentOfOtherParameters) {
  // A model with qkv biases registers more parameters before the shared ones (which
  // therefore sit at other positions in the store); the shared names must start equal.
  ModelConfig small, big;
  big.qkv_bias = true;
  ParameterStore s1(42, torch::kFloat), s2(42, torch::kFloat);
  LlamaModel m1(small, s1), m2(big, s2);
  int shared = 0;
  for (const auto& p : s1.all()) {
    const Parameter* q = s2.find(p.spec.name);
    ASSERT_NE(q, nullptr) << p.spec.name;
    EXPECT_TRUE(torch::equal(p.value, q->value)) << p.spec.name;
    ++shared;
  }
  EXPECT_EQ(shared, int(s1.all().size()));
  EXPECT_GT(s2.all().size(), s1.all().size());
}

TEST(ParamSpec, ShardsConcatenateToGlobal) {
  ParamSpec col{"w", {8, 6}, 0};
  ParamSpec row{"w", {8, 6}, 1};
  torch::Tensor global = initial_global_value(col, 1);
  for (const ParamSpec& spec : {col, row}) {
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < 2; ++r) parts.push_back(local_shard(global, spec, {r, 2}));
    EXPECT_TRUE(torch::equal(torch::cat(parts, spec.shard_dim), global));
  }
}

TEST(ParamSpec, SpecsDescribeModel) {
  ModelConfig c;
  ParameterStore store(1, torch::kFloat);
  LlamaModel model(c, store);
  int64_t total = 0;
  for (const auto& p : store.all()) {
    EXPECT_EQ(p.value.sizes().vec(), p.spec.padded_shape()) << p.spec.name;
    total += p.spec.numel();
    const bool is_norm = p.spec.name.find("norm") != std::string::npos;
    EXPECT_EQ(p.spec.weight_decay, !is_norm) << p.spec.name;
    if (is_norm) {
      EXPECT_TRUE(torch::all(p.value == 1).item<bool>()) << p.spec.name;
    }
  }
  EXPECT_EQ(total, c.parameter_count());
  EXPECT_EQ(store.find("layers.1.attn.o_proj.weight")->spec.shard_dim, 1);
  EXPECT_EQ(store.find("layers.1.mlp.gate_proj.weight")->spec.shard_dim, 0);
}
