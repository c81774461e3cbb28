// tests/unit/trainer_test.cpp: end-to-end training on the shipped corpus: the loss falls
// from about ln(256) far below it; 2N steps in one run equal N steps, save, resume, N steps
// (identical losses, parameters and checkpoint headers), also with the optimizer step inside
// backward and when switching it at resume; and a run is reproducible from its seed.
#include "engine/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/config/config.h"
#include "tests/support/scratch_dir.h"

using namespace retort::engine;
namespace fs = std::filesystem;

namespace {

std::vector<double> losses_of(const std::vector<StepResult>& results) {
  std::vector<double> losses;
  for (const StepResult& r : results) losses.push_back(r.loss);
  return losses;
}

TrainConfig tiny(const std::string& run_dir, std::vector<std::string> overrides) {
  std::vector<std::string> all = {"data.paths=[" RETORT_TEST_CORPUS "]", "run.dir=" + run_dir,
                                  "runtime.peak_gflops=100"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return make_train_config(Config::load(RETORT_TEST_CONFIGS "/tiny.yaml", all), 1);
}

// The index.json of a run's last checkpoint, less its tensor table.
nlohmann::json read_index_header(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "checkpoints" / "step_00000008" / "index.json");
  EXPECT_TRUE(in.good()) << run_dir << " has no step-8 checkpoint";
  nlohmann::json index = nlohmann::json::parse(in, nullptr, false);
  if (index.is_object()) index.erase("tensors");
  return index;
}

std::string fresh_dir(const std::string& name) {
  return retort::testing::scratch_dir("trainer_test_" + name);
}

TEST(Trainer, LossFallsFarBelowUniform) {
  // A shorter version of configs/tiny.yaml: 60 steps of 16 x 128 tokens.
  Trainer trainer(tiny(fresh_dir("learn"), {"training.steps=60", "training.global_batch=16",
                                            "training.eval_every=60", "optimizer.warmup_steps=10"}),
                  nullptr);
  std::vector<double> losses = losses_of(trainer.run());
  ASSERT_EQ(losses.size(), 60u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.15);  // starts at the uniform guess
  EXPECT_LT(losses.back(), 2.8);                       // bytes of English are learnt
  EXPECT_LT(trainer.evaluate(), 2.8);                  // and generalise to held-out text
}

// Largest difference relative to b's largest magnitude.
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// 8 steps straight with `straight_keys` equal 4 steps with `first_keys`, save, and 4 resumed
// steps with `resumed_keys`: losses, parameters and AdamW state bitwise, or, where the two
// runs form some sums in another order, within `tolerance` relative.
void expect_resume_equals_uninterrupted(const std::string& name,
                                        const std::vector<std::string>& straight_keys,
                                        const std::vector<std::string>& first_keys,
                                        const std::vector<std::string>& resumed_keys,
                                        double tolerance = 0) {
  const std::vector<std::string> shape = {
      "model.layers=2",           "model.hidden=64",         "model.ffn_hidden=172",
      "data.seq_len=32",          "training.global_batch=8", "training.micro_batch=4",
      "optimizer.warmup_steps=2", "training.eval_every=0",   "training.steps=8"};
  auto with = [&](const std::vector<std::string>& keys, std::vector<std::string> extra) {
    extra.insert(extra.begin(), keys.begin(), keys.end());
    extra.insert(extra.begin(), shape.begin(), shape.end());
    return extra;
  };
  const std::string straight_dir = fresh_dir(name + "_straight"),
                    split_dir = fresh_dir(name + "_split");
  Trainer straight(tiny(straight_dir, with(straight_keys, {})), nullptr);
  std::vector<double> all_losses = losses_of(straight.run());

  Trainer first(tiny(split_dir, with(first_keys, {})), nullptr);
  // Stop after 4 of the 8 scheduled steps (same LR schedule), as an interrupted run would.
  std::vector<double> split_losses;
  for (int i = 0; i < 4; ++i) split_losses.push_back(first.train_step().loss);
  first.save(checkpoint_path(split_dir, first.step()));
  // Disturb the global torch generator: resume must restore it from the checkpoint.
  torch::rand({3});

  Trainer resumed(tiny(split_dir, with(resumed_keys, {"checkpoint.load=" + split_dir})), nullptr);
  EXPECT_EQ(resumed.step(), 4);
  std::vector<double> rest = losses_of(resumed.run());
  split_losses.insert(split_losses.end(), rest.begin(), rest.end());

  ASSERT_EQ(split_losses.size(), all_losses.size());
  for (size_t i = 0; i < all_losses.size(); ++i)
    if (tolerance == 0)
      EXPECT_EQ(split_losses[i], all_losses[i]) << "step " << i + 1;  // bitwise
    else
      EXPECT_LE(std::abs(split_losses[i] - all_losses[i]), tolerance * std::abs(all_losses[i]))
          << "step " << i + 1;
  auto expect_same = [&](const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
    if (tolerance == 0)
      EXPECT_TRUE(torch::equal(a, b)) << what;
    else
      EXPECT_LE(relative_difference(b, a), tolerance) << what;
  };
  auto& a = straight.parameters().all();
  auto& b = resumed.parameters().all();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    expect_same(a[i].value, b[i].value, a[i].spec.name);
    expect_same(straight.optimizer().states()[i].exp_avg, resumed.optimizer().states()[i].exp_avg,
                a[i].spec.name + " exp_avg");
    expect_same(straight.optimizer().states()[i].exp_avg_sq,
                resumed.optimizer().states()[i].exp_avg_sq, a[i].spec.name + " exp_avg_sq");
  }
  EXPECT_EQ(straight.optimizer().steps(), resumed.optimizer().steps());
  // Both runs end with a checkpoint (checkpoint.save_at_end): the resumed run's header records
  // what the uninterrupted run's does, the data position included (8 steps of 8 samples).
  const nlohmann::json straight_header = read_index_header(straight_dir),
                       resumed_header = read_index_header(split_dir);
  EXPECT_EQ(straight_header.value("consumed_samples", -1), 8 * 8);
  for (const char* key : {"step", "consumed_samples", "optimizer_steps", "seed", "seq_len"})
    EXPECT_EQ(resumed_header.value(key, nlohmann::json()),
              straight_header.value(key, nlohmann::json()))
        << key;
}

}  // namespace

TEST(Trainer, ResumeEqualsUninterruptedRun) {
  expect_resume_equals_uninterrupted("plain", {}, {}, {});
}

// bf16 mixed precision: checkpoints hold the float32 main weights and AdamW state, and the
// bf16 compute copies are cast again from them, so the resumed run is the uninterrupted one
// bit for bit; with the optimizer inside backward and the tied head too.
TEST(Trainer, ResumeIsExactInBFloat16) {
  const std::vector<std::string> bf16 = {"model.dtype=bfloat16"};
  expect_resume_equals_uninterrupted("bf16", bf16, bf16, bf16);
  const std::vector<std::string> in_backward = {
      "model.dtype=bfloat16", "optimizer.grad_clip=0", "optimizer.in_backward=true",
      "optimizer.grad_clip=0", "model.tied_embeddings=true"};
  expect_resume_equals_uninterrupted("bf16_in_backward", in_backward, in_backward, in_backward);
}

// The optimizer step inside backward (2 micro-batches accumulated per step) stores the same
// optimizer state, so it resumes exactly, and can be switched on or off at resume. Switched,
// the head's products take other shapes for part of the run (tests/mpi/memory_exactness_test.cpp
// says why that is not bitwise on every CPU), so those runs are float64 and held to the bound
// derived there for 8 steps of hidden 64 and chunks of at most 128 tokens:
// 8 x 2 x (2 x 64 u + 2 x 128 u) = 6.8e-13 < 1e-12.
TEST(Trainer, ResumeWithOptimizerInBackward) {
  const std::vector<std::string> off = {"optimizer.grad_clip=0"};
  const std::vector<std::string> on = {"optimizer.grad_clip=0", "optimizer.in_backward=true",
                                       "optimizer.grad_clip=0"};
  expect_resume_equals_uninterrupted("in_backward", on, on, on);
  std::vector<std::string> off64 = off, on64 = on;
  off64.push_back("model.dtype=float64");
  on64.push_back("model.dtype=float64");
  constexpr double kReordered = 1e-12;
  expect_resume_equals_uninterrupted("switched_on", off64, off64, on64, kReordered);
  expect_resume_equals_uninterrupted("switched_off", off64, on64, off64, kReordered);
  // Tied: the head rows the lookup reaches step at the end of backward, the rest in blocks.
  std::vector<std::string> tied_on = on, tied_off64 = off64, tied_on64 = on64;
  tied_on.push_back("model.tied_embeddings=true");
  tied_off64.push_back("model.tied_embeddings=true");
  tied_on64.push_back("model.tied_embeddings=true");
  expect_resume_equals_uninterrupted("in_backward_tied", tied_on, tied_on, tied_on);
  expect_resume_equals_uninterrupted("switched_on_tied", tied_off64, tied_off64, tied_on64,
                                     kReordered);
}

TEST(Trainer, SameSeedSameRunDifferentSeedDifferentRun) {
  auto losses = [&](const std::string& seed) {
    Trainer t(tiny(fresh_dir("seed" + seed),
                   {"seed=" + seed, "training.steps=3", "model.layers=1", "data.seq_len=32",
                    "training.global_batch=4", "training.micro_batch=4", "training.eval_every=0",
                    "checkpoint.save_at_end=false"}),
              nullptr);
    return losses_of(t.run());
  };
  EXPECT_EQ(losses("5"), losses("5"));
  EXPECT_NE(losses("5"), losses("6"));
}

TEST(Trainer, KeepLastKeepsTheNewestCheckpoints) {
  const std::string dir = fresh_dir("keep_last");
  Trainer trainer(tiny(dir, {"training.steps=5", "checkpoint.save_every=1",
                             "checkpoint.keep_last=2", "training.eval_every=0", "model.hidden=32",
                             "model.heads=2", "model.kv_heads=1", "data.seq_len=16"}),
                  nullptr);
  trainer.run();
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "checkpoints"))
    if (e.is_directory()) kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"step_00000004", "step_00000005"}));
  EXPECT_EQ(resolve_checkpoint(dir), (fs::path(dir) / "checkpoints" / "step_00000005").string());
}

// A distillation step's reported terms are the parts of its loss: loss = lm_weight x lm +
// logit_weight x logit + activation_weight x activation (configs/consistency_distill.yaml: 0.5,
// 1, 0.5), the activation term the sum of its pairs', each term read once at the step's end
// from where the losses were formed, over two micro-batches.
TEST(Trainer, DistillationTermsAreThePartsOfTheLoss) {
  const TrainConfig config = make_train_config(
      Config::load(RETORT_TEST_CONFIGS "/consistency_distill.yaml",
                   {"data.paths=[" RETORT_TEST_CORPUS "]", "run.dir=" + fresh_dir("terms"),
                    "training.steps=1", "checkpoint.save_at_end=false"}),
      1);
  Trainer trainer(config, nullptr);
  const StepResult result = trainer.train_step();
  const retort::distill::LossTerms& t = result.terms;
  EXPECT_GT(t.lm, 0);
  EXPECT_GT(t.logits, 0);
  EXPECT_GT(t.activations, 0);
  ASSERT_EQ(t.per_pair.size(), 3u);
  double pairs = 0;
  for (const auto& [name, value] : t.per_pair) {
    EXPECT_GT(value, 0) << name;
    pairs += value;
  }
  EXPECT_NEAR(t.activations, pairs, 1e-6 * t.activations);
  EXPECT_NEAR(result.loss, 0.5 * t.lm + 1.0 * t.logits + 0.5 * t.activations, 1e-5 * result.loss);
}

namespace {

// How the LM head's gradient travels, for each legal combination of its keys, written out by
// hand (engine/train/head_gradient.h).
TEST(HeadGradientModes, EachCombinationOfKeysResolvesToItsMode) {
  auto mode = [](std::vector<std::string> keys, HeadGradientFacts facts = {}) {
    keys.push_back("data.paths=[x]");
    return resolve_head_gradient(make_train_config(Config::load("", keys), 1), facts);
  };
  HeadGradientFacts dp2;
  dp2.dp_size = 2;
  HeadGradientFacts last_stage;  // a pipeline's last stage: the head without the embedding
  last_stage.embedding_here = false;
  HeadGradientFacts no_head;
  no_head.head_here = false;
  HeadGradientFacts frozen;
  frozen.head_frozen = true;
  const std::string tied = "model.tied_embeddings=true", untied = "model.tied_embeddings=false";
  EXPECT_EQ(mode({untied}), HeadGradient::autograd);
  EXPECT_EQ(mode({untied}, dp2), HeadGradient::autograd);
  EXPECT_EQ(mode({untied, "parallel.dp_head_blocks=true"}, dp2), HeadGradient::reduced_in_blocks);
  EXPECT_EQ(mode({untied, "parallel.dp_head_blocks=true"}), HeadGradient::autograd);  // DP 1
  EXPECT_EQ(mode({tied}), HeadGradient::tied_in_place);
  EXPECT_EQ(mode({tied}, dp2), HeadGradient::reduced_in_blocks);
  EXPECT_EQ(mode({tied, "memory.defer_head_gradient=true"}), HeadGradient::tied_deferred);
  EXPECT_EQ(mode({tied, "memory.defer_head_gradient=true"}, dp2), HeadGradient::reduced_in_blocks);
  // Deferral needs the LM loss's fused head: not the unfused head, not the logit losses.
  EXPECT_EQ(mode({tied, "memory.defer_head_gradient=true", "memory.head_chunk_tokens=0"}),
            HeadGradient::tied_in_place);
  EXPECT_EQ(mode({tied, "memory.defer_head_gradient=true", "distill.logit_weight=1"}),
            HeadGradient::tied_in_place);
  EXPECT_EQ(mode({untied, "optimizer.in_backward=true", "optimizer.grad_clip=0"}),
            HeadGradient::stepped_in_backward);
  EXPECT_EQ(mode({tied, "optimizer.in_backward=true", "optimizer.grad_clip=0"}, dp2),
            HeadGradient::stepped_in_backward);
  // The last stage's copy of a tied weight waits for the first stage's sum.
  EXPECT_EQ(mode({tied, "optimizer.in_backward=true", "optimizer.grad_clip=0"}, last_stage),
            HeadGradient::autograd);
  EXPECT_EQ(mode({untied, "optimizer.in_backward=true", "optimizer.grad_clip=0"}, last_stage),
            HeadGradient::stepped_in_backward);
  EXPECT_EQ(mode({untied}, no_head), HeadGradient::none);
  EXPECT_EQ(mode({untied, "optimizer.in_backward=true", "optimizer.grad_clip=0"}, frozen),
            HeadGradient::none);
  EXPECT_TRUE(streams_to_stepper(HeadGradient::stepped_in_backward));
  EXPECT_TRUE(streams_to_stepper(HeadGradient::reduced_in_blocks));
  EXPECT_FALSE(streams_to_stepper(HeadGradient::tied_deferred));
}

}  // namespace
