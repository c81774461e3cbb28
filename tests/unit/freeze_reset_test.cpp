// tests/unit/freeze_reset_test.cpp: layer freezing and partial reset on the tiny model.
// Frozen parameters stay bitwise unchanged and get no optimizer state; reset parameters
// differ from the checkpoint and follow their init distribution while every other parameter
// equals the checkpoint bitwise; loading is strict about names and shapes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "common/user_error.h"
#include "engine/config/config.h"
#include "engine/train/trainer.h"
#include "tests/support/scratch_dir.h"

using namespace retort;
using namespace retort::engine;
namespace fs = std::filesystem;

namespace {

TrainConfig small(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> all = {"data.paths=[" RETORT_TEST_CORPUS "]",
                                  "run.dir=" + dir,
                                  "model.layers=2",
                                  "model.hidden=64",
                                  "model.ffn_hidden=128",
                                  "data.seq_len=32",
                                  "training.global_batch=4",
                                  "training.micro_batch=4",
                                  "training.eval_every=0",
                                  "runtime.peak_gflops=1",
                                  "optimizer.warmup_steps=0",
                                  "training.steps=3"};
  all.insert(all.end(), extra.begin(), extra.end());
  return make_train_config(Config::load(RETORT_TEST_CONFIGS "/tiny.yaml", all), 1);
}

std::string fresh(const std::string& name) {
  return retort::testing::scratch_dir("freeze_reset_" + name);
}

bool matches_mlp_of_layer0(const std::string& name) {
  return name.rfind("layers.0.mlp.", 0) == 0;
}

}  // namespace

TEST(Freeze, FrozenParametersUnchangedWithoutState) {
  Trainer trainer(small(fresh("freeze"), {"model.freeze=[layers.0.mlp.*, embed.weight]",
                                          "checkpoint.save_at_end=false"}),
                  nullptr);
  std::vector<torch::Tensor> before;
  for (auto& p : trainer.parameters().all()) before.push_back(p.value.detach().clone());
  trainer.run();
  int frozen = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const auto& p = trainer.parameters().all()[i];
    const bool should_freeze = matches_mlp_of_layer0(p.spec.name) || p.spec.name == "embed.weight";
    EXPECT_EQ(p.spec.frozen(), should_freeze) << p.spec.name;
    if (should_freeze) {
      ++frozen;
      EXPECT_TRUE(torch::equal(p.value, before[i])) << p.spec.name;
      EXPECT_FALSE(p.value.requires_grad()) << p.spec.name;
      EXPECT_FALSE(trainer.optimizer().states()[i].exp_avg.defined()) << p.spec.name;
    } else if (p.spec.name.find("norm") == std::string::npos) {
      EXPECT_FALSE(torch::equal(p.value, before[i])) << p.spec.name << " did not train";
    }
  }
  EXPECT_EQ(frozen, 4);  // gate, up, down of layer 0 and the embedding
}

TEST(Reset, ResetFollowsInitOthersEqualCheckpoint) {
  const std::string teacher_dir = fresh("teacher");
  Trainer teacher(small(teacher_dir, {}), nullptr);
  teacher.run();  // saves teacher_dir/checkpoints/step_00000003.h5
  Trainer student(small(fresh("student"),
                        {"model.init.from=" + teacher_dir, "model.init.reset=[layers.*.attn.*]"}),
                  nullptr);
  EXPECT_EQ(student.step(), 0);  // starts a new run, not a resume
  int reset = 0;
  for (size_t i = 0; i < student.parameters().all().size(); ++i) {
    const auto& p = student.parameters().all()[i];
    const auto& t = teacher.parameters().all()[i];
    ASSERT_EQ(p.spec.name, t.spec.name);
    if (p.spec.name.find(".attn.") != std::string::npos) {
      ++reset;
      EXPECT_FALSE(torch::equal(p.value, t.value)) << p.spec.name;
      EXPECT_TRUE(torch::equal(p.value, layers::initial_global_value(p.spec, 1234))) << p.spec.name;
      // And the init distribution: zero mean, the spec's standard deviation.
      EXPECT_NEAR(p.value.mean().item<double>(), 0.0, 0.2 * p.spec.init_std);
      EXPECT_NEAR(p.value.std().item<double>(), p.spec.init_std, 0.1 * p.spec.init_std);
    } else {
      EXPECT_TRUE(torch::equal(p.value, t.value)) << p.spec.name;
    }
  }
  EXPECT_EQ(reset, 8);  // q, k, v, o in two layers
}

TEST(Teacher, ShapeComesFromItsCheckpoint) {
  // A teacher trained with 3 layers and hidden 96; the student config names no teacher sizes.
  const std::string dir = fresh("wide_teacher");
  Trainer wide(small(dir, {"model.layers=3", "model.hidden=96", "model.heads=4", "model.kv_heads=2",
                           "model.ffn_hidden=160"}),
               nullptr);
  wide.run();
  Trainer student(small(fresh("from_wide"), {"teacher.checkpoint=" + dir, "distill.logit_weight=1",
                                             "checkpoint.save_at_end=false"}),
                  nullptr);
  ASSERT_NE(student.teacher(), nullptr);
  EXPECT_EQ(student.teacher()->config().layers, 3);
  EXPECT_EQ(student.teacher()->config().hidden, 96);
  EXPECT_TRUE(
      torch::equal(student.teacher()->parameters().find("layers.2.mlp.up_proj.weight")->value,
                   wide.parameters().find("layers.2.mlp.up_proj.weight")->value));
  EXPECT_TRUE(std::isfinite(student.train_step().loss));
}

// Teacher sizes given beside a teacher checkpoint must agree with it, and the checkpoint's own
// description still decides the rest (its RoPE here), not the student's keys.
TEST(Teacher, GivenSizesMustAgreeWithItsCheckpoint) {
  const std::string dir = fresh("rope_teacher");
  Trainer teacher(small(dir, {"model.hidden=96", "model.heads=4", "model.kv_heads=2",
                              "model.ffn_hidden=160", "model.rope_theta=500"}),
                  nullptr);
  teacher.run();
  Trainer agreeing(
      small(fresh("agreeing"), {"teacher.checkpoint=" + dir, "teacher.hidden=96",
                                "distill.logit_weight=1", "checkpoint.save_at_end=false"}),
      nullptr);
  EXPECT_EQ(agreeing.teacher()->config().rope_theta, 500.0);
  try {
    Trainer disagreeing(
        small(fresh("disagreeing"),
              {"teacher.checkpoint=" + dir, "teacher.hidden=128", "distill.logit_weight=1"}),
        nullptr);
    FAIL() << "a teacher.hidden the checkpoint does not have was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("teacher.hidden=128, but the teacher at"),
              std::string::npos)
        << e.what();
  }
  // Its head's tying too (the planner's teacher.tied_embeddings): this teacher's is untied.
  Trainer untied(
      small(fresh("untied"), {"teacher.checkpoint=" + dir, "teacher.tied_embeddings=untied",
                              "distill.logit_weight=1", "checkpoint.save_at_end=false"}),
      nullptr);
  EXPECT_FALSE(untied.teacher()->config().tied_embeddings);
  try {
    Trainer tied(small(fresh("tied"), {"teacher.checkpoint=" + dir, "teacher.tied_embeddings=tied",
                                       "distill.logit_weight=1"}),
                 nullptr);
    FAIL() << "teacher.tied_embeddings=tied was accepted for an untied teacher";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("teacher.tied_embeddings=tied, but the teacher at"),
              std::string::npos)
        << e.what();
  }
}

TEST(Reset, LoadingIsStrict) {
  const std::string dir = fresh("strict");
  Trainer source(small(dir, {}), nullptr);
  source.run();
  auto refusal = [&](std::vector<std::string> extra) {
    extra.push_back("model.init.from=" + dir);
    try {
      Trainer t(small(fresh("strict_target"), extra), nullptr);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = refusal({"model.ffn_hidden=96"});
  EXPECT_NE(e.find("'params/layers.0.mlp.gate_proj.weight' has shape [128, 64] but the model "
                   "expects [96, 64]"),
            std::string::npos)
      << e;
  e = refusal({"model.tied_embeddings=true"});
  EXPECT_NE(e.find("has parameter 'lm_head.weight' that this model does not have"),
            std::string::npos)
      << e;
  e = refusal({"model.init.reset=[nothing.*]"});
  EXPECT_NE(e.find("pattern 'nothing.*' matches no parameter"), std::string::npos) << e;
}
