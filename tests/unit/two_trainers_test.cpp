// tests/unit/two_trainers_test.cpp: trainers alive together in one process keep their own
// run settings. Two distillation runs that differ in kernel choice (runtime.kernels), precision
// (model.dtype) and memory keys (activation checkpointing, kept compute weights, head chunks),
// their steps alternated, must each give bitwise the losses, gradient norms and parameters they
// give alone: nothing one trainer sets may leak into the other's steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/train/trainer.h"
#include "layers/kernel_policy.h"
#include "tests/support/scratch_dir.h"

using namespace retort::engine;

namespace {

constexpr int kSteps = 3;

TrainConfig distill_run(const std::string& name, std::vector<std::string> keys) {
  keys.insert(keys.end(), {"data.paths=[" RETORT_TEST_CORPUS "]",
                           "run.dir=" + retort::testing::scratch_dir("two_trainers_" + name),
                           "checkpoint.save_at_end=false", "training.steps=3"});
  return make_train_config(Config::load(RETORT_TEST_CONFIGS "/consistency_distill.yaml", keys), 1);
}

// Fused ATen operators everywhere, float32, selective recomputation.
TrainConfig first() {
  return distill_run("first", {"runtime.kernels=aten", "model.dtype=float32",
                               "memory.activation_checkpointing=selective"});
}
// Our loops where the dispatch table sends them, bf16, compute weights cast at each use,
// another head chunk.
TrainConfig second() {
  return distill_run("second", {"runtime.kernels=automatic", "model.dtype=bfloat16",
                                "memory.keep_compute_weights=false", "memory.head_chunk_tokens=16",
                                "distill.chunk_tokens=16"});
}

struct Outcome {
  std::vector<double> losses, grad_norms;
  std::vector<torch::Tensor> parameters;
};

void record_step(Trainer& trainer, Outcome& outcome) {
  const StepResult result = trainer.train_step();
  outcome.losses.push_back(result.loss);
  outcome.grad_norms.push_back(result.grad_norm);
}

void record_parameters(Trainer& trainer, Outcome& outcome) {
  for (const auto& p : trainer.parameters().all()) outcome.parameters.push_back(p.value.clone());
}

Outcome alone(const TrainConfig& config) {
  Trainer trainer(config, nullptr);
  Outcome outcome;
  for (int step = 0; step < kSteps; ++step) record_step(trainer, outcome);
  record_parameters(trainer, outcome);
  return outcome;
}

void expect_bitwise(const Outcome& got, const Outcome& want, const std::string& which) {
  SCOPED_TRACE(which);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.grad_norms, want.grad_norms);
  ASSERT_EQ(got.parameters.size(), want.parameters.size());
  for (size_t i = 0; i < got.parameters.size(); ++i)
    EXPECT_TRUE(torch::equal(got.parameters[i], want.parameters[i])) << "parameter " << i;
}

TEST(TwoTrainers, AlternatedStepsGiveEachTheResultsItGivesAlone) {
  const Outcome first_alone = alone(first()), second_alone = alone(second());
  // The settings change the numbers, so a trainer run with the other's would be caught.
  TrainConfig first_in_second_mode = first();
  first_in_second_mode.runtime.kernels = KernelChoice::automatic;
  // (Under RETORT_KERNELS=aten both take ATen whatever the key says: nothing to tell apart.)
  if (retort::layers::environment_kernel_mode() != retort::kernels::KernelMode::aten)
    EXPECT_NE(alone(first_in_second_mode).losses, first_alone.losses)
        << "the kernel choice does not change this run's numbers: the test cannot see it leak";

  Trainer a(first(), nullptr), b(second(), nullptr);  // b built last, as a bench would
  Outcome first_together, second_together;
  for (int step = 0; step < kSteps; ++step) {
    record_step(a, first_together);
    record_step(b, second_together);
  }
  record_parameters(a, first_together);
  record_parameters(b, second_together);
  expect_bitwise(first_together, first_alone, "the ATen float32 run beside the other");
  expect_bitwise(second_together, second_alone, "the bf16 run beside the other");
}

}  // namespace
