// tests/unit/config_test.cpp: strict YAML config loading and key=value overrides: values
// land typed, and each kind of bad input is refused with a message naming the culprit.
#include "engine/config/config.h"

#include <gtest/gtest.h>

#include "common/user_error.h"
#include "engine/config/precision_policy.h"
#include "engine/config/train_config.h"
#include "engine/observe/run_summary.h"
#include "tests/support/user_error_of.h"

using namespace retort;
using namespace retort::engine;

using retort::testing::error_of;

TEST(Config, ReadsNestedYamlAndOverrides) {
  Config c;
  c.merge_yaml_text(
      "training:\n  steps: 7\n  micro_batch: 2\nmodel:\n  layer_windows: [0, 4]\n"
      "parallel:\n  data: auto\n",
      "t.yaml");
  c.apply_override("optimizer.lr=0.5");
  c.apply_override("data.paths=[a, b]");
  EXPECT_EQ(c.get_int("training.steps"), 7);
  EXPECT_EQ(c.get_int("training.micro_batch"), 2);
  EXPECT_EQ(c.get_int_list("model.layer_windows"), (std::vector<int64_t>{0, 4}));
  EXPECT_DOUBLE_EQ(c.get_float("optimizer.lr"), 0.5);
  EXPECT_EQ(c.get_string_list("data.paths"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.get_int("parallel.data"), 0);
  EXPECT_EQ(c.origin("training.steps"), "t.yaml:2");
  EXPECT_EQ(c.origin("optimizer.lr"), "override 'optimizer.lr=0.5'");
  EXPECT_EQ(c.get_int("model.hidden"), 64);  // default kept
}

TEST(Config, ResolvedYamlRoundTrips) {
  Config c;
  c.apply_override("training.steps=9");
  c.apply_override("data.paths=[x]");
  Config again;
  again.merge_yaml_text(c.to_yaml(), "dump");
  EXPECT_EQ(again.to_yaml(), c.to_yaml());
  EXPECT_EQ(again.get_int("training.steps"), 9);
}

TEST(Config, UnknownKeySuggestsClosest) {
  Config c;
  std::string e = error_of([&] { c.merge_yaml_text("training:\n  stpes: 5\n", "f.yaml"); });
  EXPECT_NE(e.find("f.yaml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown config key 'training.stpes'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'training.steps'"), std::string::npos) << e;
  e = error_of([&] { c.merge_yaml_text("trainig:\n  steps: 5\n", "f.yaml"); });
  EXPECT_NE(e.find("unknown config key 'trainig'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'training'"), std::string::npos) << e;
}

TEST(Config, WrongTypeNamesKeyAndLine) {
  Config c;
  std::string e =
      error_of([&] { c.merge_yaml_text("seed: 1\noptimizer:\n  lr: fast\n", "g.yaml"); });
  EXPECT_NE(e.find("g.yaml:3"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer.lr expects a number, got 'fast'"), std::string::npos) << e;
  e = error_of([&] { c.merge_yaml_text("training:\n  steps: [1, 2]\n", "g.yaml"); });
  EXPECT_NE(e.find("training.steps expects an integer, got a list"), std::string::npos) << e;
  e = error_of([&] { c.merge_yaml_text("model: 5\n", "g.yaml"); });
  EXPECT_NE(e.find("'model' is a section"), std::string::npos) << e;
}

TEST(Config, OutOfRangeAndChoices) {
  Config c;
  std::string e = error_of([&] { c.apply_override("training.micro_batch=0"); });
  EXPECT_NE(e.find("training.micro_batch = 0 is out of range"), std::string::npos) << e;
  e = error_of([&] { c.apply_override("optimizer.schedule=exp"); });
  EXPECT_NE(e.find("not one of: cosine, linear, constant"), std::string::npos) << e;
}

TEST(Config, MalformedOverrides) {
  Config c;
  std::string e = error_of([&] { c.apply_override("training.steps"); });
  EXPECT_NE(e.find("malformed override 'training.steps': expected key=value"), std::string::npos)
      << e;
  e = error_of([&] { c.apply_override("=3"); });
  EXPECT_NE(e.find("malformed override '=3'"), std::string::npos) << e;
  e = error_of([&] { c.apply_override("training.steps=many"); });
  EXPECT_NE(e.find("override 'training.steps=many': training.steps expects an integer"),
            std::string::npos)
      << e;
  e = error_of([&] { c.apply_override("training.step=3"); });
  EXPECT_NE(e.find("did you mean 'training.steps'"), std::string::npos) << e;
  e = error_of([&] { c.apply_override("data.paths=[a, "); });
  EXPECT_NE(e.find("malformed override"), std::string::npos) << e;
}

TEST(Config, YamlSyntaxErrorNamesLine) {
  Config c;
  std::string e = error_of([&] { c.merge_yaml_text("training:\n  steps: [1\n", "h.yaml"); });
  EXPECT_NE(e.find("h.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
  e = error_of([&] { Config::load("/nonexistent/run.yaml", {}); });
  EXPECT_NE(e.find("cannot open config file '/nonexistent/run.yaml'"), std::string::npos) << e;
}

TEST(Config, CrossKeyChecks) {
  auto with = [](std::vector<std::string> overrides) {
    overrides.push_back("data.paths=[x]");
    return Config::load("", overrides);
  };
  std::string e = error_of([&] { make_train_config(with({"model.heads=3"}), 1); });
  EXPECT_NE(e.find("model.hidden=64 is not divisible by model.heads=3"), std::string::npos) << e;
  e = error_of([&] { make_train_config(with({"training.global_batch=6"}), 1); });
  EXPECT_NE(e.find("training.global_batch=6 is not a multiple"), std::string::npos) << e;
  e = error_of([&] { make_train_config(with({"model.layer_windows=[1]"}), 1); });
  EXPECT_NE(e.find("model.layer_windows has 1 entries but model.layers=2"), std::string::npos) << e;
  e = error_of([&] { make_train_config(Config::load("", {}), 1); });
  EXPECT_NE(e.find("data.paths is empty"), std::string::npos) << e;
  // The memory features refuse the combinations they cannot do exactly.
  e = error_of([&] { make_train_config(with({"optimizer.in_backward=true"}), 1); });
  EXPECT_NE(e.find("set optimizer.grad_clip: 0 (it is 1"), std::string::npos) << e;
  e = error_of([&] { make_train_config(with({"memory.activation_offloading=true"}), 1); });
  EXPECT_NE(e.find("set memory.activation_checkpointing to full or selective"), std::string::npos)
      << e;
  TrainConfig m = make_train_config(
      with({"optimizer.in_backward=true", "optimizer.grad_clip=0",
            "memory.activation_checkpointing=selective", "memory.activation_offloading=true"}),
      1);
  EXPECT_TRUE(m.optimizer.in_backward);
  EXPECT_EQ(m.memory.activation_checkpointing, layers::Checkpointing::selective);
  EXPECT_TRUE(m.memory.activation_offloading);
  TrainConfig t = make_train_config(with({"training.global_batch=16"}), 1);
  EXPECT_EQ(t.accumulation_steps(), 4);
  EXPECT_EQ(t.layout.data, 1);
}

// The key table assigns every key into its member: one key of each type, enums parsed at the
// boundary (a wrong name never reaches the engine), "auto", defaults from the key lists.
TEST(ConfigKeys, EveryKindOfValueReachesTrainConfig) {
  const TrainConfig defaults = make_train_config(Config::load("", {"data.paths=[x]"}), 1);
  EXPECT_EQ(defaults.optimizer.schedule.shape, LrShape::cosine);
  EXPECT_EQ(defaults.optimizer.schedule.decay_steps, defaults.training.steps);  // 0 = steps
  EXPECT_EQ(defaults.parallel.data.value, 0);                                   // auto
  EXPECT_EQ(defaults.layout.data, 1);
  EXPECT_EQ(defaults.dtype, DType::float32);
  EXPECT_EQ(defaults.model.hidden, layers::ModelConfig().hidden);

  const TrainConfig t = make_train_config(Config::load("", {"data.paths=[x, y]",
                                                            "data.weights=[2, 1]",
                                                            "optimizer.schedule=linear",
                                                            "optimizer.lr=0.5",
                                                            "optimizer.min_lr=0.25",
                                                            "optimizer.decay_steps=7",
                                                            "distill.logit_loss=soft_ce",
                                                            "distill.activation_loss=cosine",
                                                            "distill.logit_weight=1",
                                                            "distill.temperature=2.5",
                                                            "distill.scale_t2=false",
                                                            "model.dtype=float64",
                                                            "runtime.device=cuda",
                                                            "parallel.data=1",
                                                            "model.layers=3",
                                                            "model.layer_windows=[3, 0, 5]",
                                                            "teacher.hidden=96",
                                                            "teacher.heads=6",
                                                            "teacher.kv_heads=3",
                                                            "model.freeze=[embed.*]",
                                                            "runtime.threads=3",
                                                            "seed=77"}),
                                          1);
  EXPECT_EQ(t.data.paths, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(t.data.weights, (std::vector<double>{2, 1}));
  EXPECT_EQ(t.optimizer.schedule.shape, LrShape::linear);
  EXPECT_EQ(t.optimizer.schedule.lr, 0.5);
  EXPECT_EQ(t.optimizer.schedule.min_lr, 0.25);
  EXPECT_EQ(t.optimizer.schedule.decay_steps, 7);
  EXPECT_EQ(t.distill.objective.logits.kind, distill::LogitLoss::soft_ce);
  EXPECT_EQ(t.distill.objective.activation_kind, distill::ActivationLoss::cosine);
  EXPECT_EQ(t.distill.objective.logits.temperature, 2.5);
  EXPECT_FALSE(t.distill.objective.logits.scale_by_t2);
  EXPECT_TRUE(t.distill.enabled);
  EXPECT_EQ(t.dtype, DType::float64);
  EXPECT_EQ(t.runtime.device, Device::cuda);
  EXPECT_EQ(t.runtime.threads, 3);
  EXPECT_EQ(t.seed, 77);
  EXPECT_EQ(t.distill.keys.seed, 77);  // teacher.seed 0 = the run seed
  EXPECT_EQ(t.parallel.data.value, 1);
  EXPECT_EQ(t.model.layer_windows, (std::vector<int64_t>{3, 0, 5}));
  EXPECT_EQ(t.distill.teacher.hidden, 96);
  EXPECT_EQ(t.distill.teacher.layers, 3);  // not given: the student's
  EXPECT_TRUE(t.distill.teacher_shape_given);
  EXPECT_EQ(t.params.freeze, (std::vector<std::string>{"embed.*"}));

  const std::string e = error_of([&] {
    Config::load("", {"data.paths=[x]", "optimizer.schedule=cosin"});
  });
  EXPECT_NE(e.find("optimizer.schedule = 'cosin' is not one of: cosine, linear, constant"),
            std::string::npos)
      << e;
}

// --dry-run's estimate under bf16 mixed precision: the float32 main weights plus their bf16
// copies (6 bytes a parameter against 4), gradients and AdamW state as in fp32, activations in
// 2 bytes against 4.
TEST(DryRun, BFloat16EstimateCountsTheCopiesAndHalvesTheActivations) {
  auto config = [](const std::string& dtype) {
    return make_train_config(Config::load("", {"data.paths=[x]", "model.dtype=" + dtype}), 1);
  };
  const MemoryEstimate fp32 = estimate_memory(config("float32"));
  const MemoryEstimate bf16 = estimate_memory(config("bfloat16"));
  EXPECT_EQ(bf16.weights * 2, fp32.weights * 3);
  EXPECT_EQ(bf16.gradients, fp32.gradients);
  EXPECT_EQ(bf16.optimizer, fp32.optimizer);
  EXPECT_EQ(bf16.activations * 2, fp32.activations);
}

// The number types of a run, each rule written by hand here (precision_policy.h).
TEST(Config, PrecisionPolicyFollowsTheTypeKeys) {
  auto policy = [](std::vector<std::string> overrides) {
    overrides.push_back("data.paths=[x]");
    return precision_policy(make_train_config(Config::load("", overrides), 1));
  };
  using N = NumberType;
  const PrecisionPolicy fp32 = policy({});
  EXPECT_FALSE(fp32.mixed());
  for (N type : {fp32.main, fp32.compute, fp32.residual, fp32.accumulation, fp32.tp_activation_sum,
                 fp32.dp_gradient_sum, fp32.pipeline_message})
    EXPECT_EQ(type, N::float32);
  const PrecisionPolicy fp64 = policy({"model.dtype=float64"});
  for (N type : {fp64.main, fp64.compute, fp64.residual, fp64.accumulation, fp64.tp_activation_sum,
                 fp64.dp_gradient_sum, fp64.pipeline_message})
    EXPECT_EQ(type, N::float64);
  // Mixed precision: bf16 products, activations and their TP sums; float32 main weights,
  // accumulation and gradient sums; the residual stream in bf16 unless fp32_residual.
  const PrecisionPolicy bf16 = policy({"model.dtype=bfloat16"});
  EXPECT_TRUE(bf16.mixed());
  EXPECT_EQ(bf16.main, N::float32);
  EXPECT_EQ(bf16.compute, N::bfloat16);
  EXPECT_EQ(bf16.residual, N::bfloat16);
  EXPECT_EQ(bf16.accumulation, N::float32);
  EXPECT_EQ(bf16.tp_activation_sum, N::bfloat16);
  EXPECT_EQ(bf16.dp_gradient_sum, N::float32);
  EXPECT_EQ(bf16.pipeline_message, N::bfloat16);
  const PrecisionPolicy wide_residual =
      policy({"model.dtype=bfloat16", "model.fp32_residual=true"});
  EXPECT_EQ(wide_residual.residual, N::float32);
  EXPECT_EQ(wide_residual.pipeline_message, N::float32);
  EXPECT_EQ(wide_residual.compute, N::bfloat16);
  const PrecisionPolicy narrow_sums =
      policy({"model.dtype=bfloat16", "parallel.dp_reduce_dtype=bfloat16"});
  EXPECT_EQ(narrow_sums.dp_gradient_sum, N::bfloat16);
  EXPECT_EQ(narrow_sums.main, N::float32);
  EXPECT_EQ(bf16.describe(),
            "main float32, compute bfloat16, residual bfloat16, accumulation float32; sums: TP "
            "activations bfloat16, DP gradients float32, pipeline messages bfloat16");
}

TEST(Config, GpuRunsDefaultToLargeChunksOfTokens) {
  auto train = [](std::vector<std::string> overrides) {
    overrides.push_back("data.paths=[x]");
    return make_train_config(Config::load("", overrides), 1);
  };
  const TrainConfig cpu = train({});
  EXPECT_EQ(cpu.memory.head_chunk_tokens, 256);
  EXPECT_EQ(cpu.distill.objective.logits.chunk_tokens, 192);
  const TrainConfig gpu = train({"runtime.device=cuda"});
  EXPECT_EQ(gpu.memory.head_chunk_tokens, 4096);
  EXPECT_EQ(gpu.distill.objective.logits.chunk_tokens, 4096);
  // A chunk the config names is kept, on the GPU too (0: the unfused head).
  const TrainConfig named =
      train({"runtime.device=cuda", "memory.head_chunk_tokens=0", "distill.chunk_tokens=512"});
  EXPECT_EQ(named.memory.head_chunk_tokens, 0);
  EXPECT_EQ(named.distill.objective.logits.chunk_tokens, 512);
}
