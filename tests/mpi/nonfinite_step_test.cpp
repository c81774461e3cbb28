// tests/mpi/nonfinite_step_test.cpp: a step whose gradient holds a NaN or an infinity on one
// rank only is skipped by every rank of a TP2 x DP2 layout (with ZeRO-1): parameters, AdamW
// state and the optimizer's step count stay bitwise what they were, the learning-rate
// schedule does not advance, and training continues with finite steps afterwards. After
// training.max_skipped_steps consecutive skips every rank stops together (AgreedStop) and the
// checkpoint saved before the bad steps is the newest and still loads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "common/user_error.h"
#include "engine/config/config.h"
#include "engine/train/trainer.h"
#include "tests/support/shared_scratch_dir.h"
#include "trainer_test_support.h"

using namespace retort;
using namespace retort::engine;
using retort::test::world_rank;
using retort::test::world_size;

namespace {

TrainConfig layout_tp2_dp2(const std::string& run_dir, std::vector<std::string> overrides) {
  std::vector<std::string> all = {"training.log_every=1",   "parallel.tensor=2",
                                  "parallel.data=2",        "parallel.sequence_parallel=true",
                                  "optimizer.zero_stage=1", "optimizer.warmup_steps=3",
                                  "run.dir=" + run_dir};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return retort::test::small_trainer_config(all);
}

// Every parameter and AdamW state tensor of this rank, copied.
std::vector<torch::Tensor> snapshot(Trainer& trainer) {
  std::vector<torch::Tensor> copies;
  for (size_t i = 0; i < trainer.parameters().all().size(); ++i) {
    copies.push_back(trainer.parameters().all()[i].value.clone());
    const AdamState& s = trainer.optimizer().states()[i];
    if (s.exp_avg.defined()) {
      copies.push_back(s.exp_avg.clone());
      copies.push_back(s.exp_avg_sq.clone());
    }
  }
  return copies;
}

bool bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

// Puts `value` into one gradient element on world rank `rank` only, at the steps `when`
// says: after gradients are whole, before the global norm and the optimizer step.
StepInspector poison_gradient(Trainer& trainer, int rank, double value,
                              std::function<bool(int64_t)> when) {
  StepInspector inspector;
  inspector.on_gradients = [&trainer, rank, value, when](const StepResult& r) {
    if (world_rank() != rank || !when(r.step)) return;
    for (auto& p : trainer.parameters().all())
      if (p.value.grad().defined()) {  // under ZeRO-1 only the owned parameters have one
        p.value.mutable_grad().view({-1})[0] = value;
        return;
      }
    FAIL() << "rank " << rank << " holds no gradient to poison";
  };
  return inspector;
}

}  // namespace

TEST(NonFiniteStep, SkippedOnEveryRankBitwiseAndTrainingContinues) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    const std::string dir = retort::testing::shared_scratch_dir("nonfinite_skip");
    TrainConfig config = layout_tp2_dp2(dir, {"training.steps=6"});
    parallel::Mesh mesh(config.layout);
    Trainer trainer(config, nullptr, mesh);
    StepInspector inspector = poison_gradient(trainer, 3, bad, [](int64_t s) { return s == 3; });
    trainer.set_inspector(&inspector);
    const StepResult first = trainer.train_step(), second = trainer.train_step();
    ASSERT_FALSE(first.skipped || second.skipped);
    const std::vector<torch::Tensor> before = snapshot(trainer);
    const int64_t optimizer_steps = trainer.optimizer().steps();

    const StepResult poisoned = trainer.train_step();
    EXPECT_TRUE(poisoned.skipped) << "value " << bad;
    EXPECT_FALSE(std::isfinite(poisoned.grad_norm));
    EXPECT_TRUE(bitwise_equal(before, snapshot(trainer))) << "a skipped step changed state";
    EXPECT_EQ(trainer.optimizer().steps(), optimizer_steps);
    EXPECT_EQ(trainer.step(), 3);  // the data moved past the bad batch

    // The schedule did not advance: step 4 runs at the learning rate step 3 was given
    // (warm-up, so consecutive rates differ).
    const StepResult next = trainer.train_step();
    EXPECT_FALSE(next.skipped);
    EXPECT_EQ(next.lr, poisoned.lr);
    EXPECT_NE(next.lr, second.lr);
    EXPECT_TRUE(std::isfinite(next.loss) && std::isfinite(next.grad_norm));
    EXPECT_FALSE(bitwise_equal(before, snapshot(trainer))) << "training did not continue";
    EXPECT_EQ(trainer.optimizer().steps(), optimizer_steps + 1);
  }
}

TEST(NonFiniteStep, StopsAfterMaxConsecutiveSkipsKeepingTheLastCheckpoint) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = retort::testing::shared_scratch_dir("nonfinite_stop");
  TrainConfig config = layout_tp2_dp2(
      dir, {"training.steps=10", "checkpoint.save_every=2", "training.max_skipped_steps=3"});
  parallel::Mesh mesh(config.layout);
  Trainer trainer(config, nullptr, mesh);
  // Steps 3, 4 and 5 go bad on rank 1; the third in a row ends the run on every rank.
  StepInspector inspector =
      poison_gradient(trainer, 1, std::nan(""), [](int64_t s) { return s >= 3; });
  trainer.set_inspector(&inspector);
  EXPECT_THROW(trainer.run(), AgreedStop);
  EXPECT_EQ(trainer.step(), 5);
  MPI_Barrier(MPI_COMM_WORLD);
  // Step 2's checkpoint is the newest: none was written during the bad streak.
  const std::vector<std::string> saved = complete_checkpoints(dir);
  ASSERT_FALSE(saved.empty());
  EXPECT_EQ(saved.front(), checkpoint_path(dir, 2));
  TrainConfig resume = layout_tp2_dp2(dir, {"training.steps=10", "checkpoint.load=auto"});
  parallel::Mesh resume_mesh(resume.layout);
  Trainer resumed(resume, nullptr, resume_mesh);
  EXPECT_EQ(resumed.step(), 2);
}
