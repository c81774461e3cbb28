// tests/mpi/trainer_mpi_test.cpp: multi-rank training properties on 4 ranks: ZeRO-1 keeps
// each parameter's AdamW state on exactly one DP rank; DP gradient buckets are all launched
// from grad-ready hooks during backward; a checkpoint written under TP2 x DP2 with ZeRO-1
// holds the same global tensors and resumes under TP4 with the loss the original layout
// gets.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "engine/config/config.h"
#include "engine/train/trainer.h"
#include "layers/sharding.h"
#include "tests/support/shared_scratch_dir.h"
#include "trainer_test_support.h"

using namespace retort;
using namespace retort::engine;
using retort::test::world_size;

namespace {

TrainConfig small(std::vector<std::string> overrides) {
  return retort::test::small_trainer_config(overrides);
}

double sum_over_world(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

}  // namespace

TEST(TrainerMpi, ZeroOneShardsOptimizerState) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  TrainConfig plain_config = small({"parallel.data=4", "training.micro_batch=1"});
  parallel::Mesh plain_mesh(plain_config.layout);
  Trainer plain(plain_config, nullptr, plain_mesh);
  TrainConfig zero_config =
      small({"parallel.data=4", "training.micro_batch=1", "optimizer.zero_stage=1"});
  parallel::Mesh zero_mesh(zero_config.layout);
  Trainer zero(zero_config, nullptr, zero_mesh);
  const double full = double(plain.optimizer().state_bytes());
  const double mine = double(zero.optimizer().state_bytes());
  EXPECT_EQ(sum_over_world(mine), full);  // every state element on exactly one rank
  EXPECT_LT(mine, 0.5 * full);            // and balanced well below the whole
  // Equal training: after two steps the parameters agree.
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(zero.train_step().loss, plain.train_step().loss, 1e-6);
  for (size_t i = 0; i < plain.parameters().all().size(); ++i)
    EXPECT_TRUE(torch::allclose(zero.parameters().all()[i].value, plain.parameters().all()[i].value,
                                1e-5, 1e-7))
        << plain.parameters().all()[i].spec.name;
}

// Both ways of summing DP buckets: through shared memory (all ranks on this machine) and
// through MPI (as across nodes); they must agree with each other.
TEST(TrainerMpi, DataParallelBucketsLaunchDuringBackward) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  std::vector<torch::Tensor> by_mode[2];
  for (bool shared : {true, false}) {
    TrainConfig config =
        small({"parallel.data=4", "training.micro_batch=1", "parallel.dp_bucket_mb=0.02",
               std::string("parallel.dp_shared_memory=") + (shared ? "true" : "false")});
    parallel::Mesh mesh(config.layout);
    Trainer trainer(config, nullptr, mesh);
    trainer.train_step();
    const GradientSync& sync = trainer.gradient_sync();
    EXPECT_EQ(sync.reduces_in_shared_memory(), shared);
    EXPECT_GT(sync.bucket_count(), 3u);
    EXPECT_EQ(sync.finished_during_backward(), int64_t(sync.bucket_count()));
    // Besides the buckets, the only DP reductions are two scalars (token count and loss).
    int64_t gradient_bytes = 0;
    for (const auto& p : trainer.parameters().all())
      gradient_bytes += p.value.numel() * p.value.element_size();
    const auto& all_reduce = mesh.gradient_reduction().counters().at("all_reduce");
    EXPECT_EQ(all_reduce.calls, int64_t(sync.bucket_count()) + 2) << "shared " << shared;
    EXPECT_EQ(all_reduce.bytes, gradient_bytes + 2 * 8) << "shared " << shared;
    if (shared) {
      // The products formed their weights' gradients in the shared segment (two micro-batches:
      // the second added into it); only the norms' and the lookup's were copied in.
      int64_t not_from_products = 0;
      for (const auto& p : trainer.parameters().all())
        if (p.spec.name == "embed.weight" || p.spec.name.find("norm.weight") != std::string::npos)
          not_from_products += p.value.numel() * p.value.element_size();
      EXPECT_EQ(sync.shared_bytes_copied_in(), not_from_products);
    }
    trainer.train_step();
    for (const auto& p : trainer.parameters().all()) by_mode[shared].push_back(p.value.clone());
  }
  for (size_t i = 0; i < by_mode[0].size(); ++i)
    EXPECT_TRUE(torch::allclose(by_mode[1][i], by_mode[0][i], 1e-6, 1e-7))
        << "parameter " << i << " after 2 steps: shared memory against MPI";
}

// Tied embeddings under DP: the head's gradient is reduced apart (HeadRowStepper) and the head
// forms it in that reduction's shared segment, so nothing of it is copied.
TEST(TrainerMpi, TiedHeadGradientIsFormedInSharedMemory) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  TrainConfig config =
      small({"parallel.data=4", "training.micro_batch=1", "model.tied_embeddings=true"});
  parallel::Mesh mesh(config.layout);
  Trainer trainer(config, nullptr, mesh);
  for (int step = 0; step < 2; ++step) trainer.train_step();
  const HeadRowStepper* head = trainer.head_stepper();
  ASSERT_NE(head, nullptr);
  ASSERT_GT(head->shared_bytes(), 0);
  EXPECT_EQ(head->shared_bytes_copied_in(), 0);
  int64_t norms = 0;
  for (const auto& p : trainer.parameters().all())
    if (p.spec.name.find("norm.weight") != std::string::npos)
      norms += p.value.numel() * p.value.element_size();
  EXPECT_EQ(trainer.gradient_sync().shared_bytes_copied_in(), 2 * norms);
}

// parallel.dp_head_blocks: the tied head's gradient reaches the DP sum in its blocks (one
// reduction each, started as backward forms it) instead of whole, and training is the same.
TEST(TrainerMpi, HeadGradientReducedInBlocksTrainsAsWhole) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  std::vector<torch::Tensor> by_mode[2];
  for (bool blocks : {false, true}) {
    TrainConfig config =
        small({"parallel.data=4", "training.micro_batch=1", "model.tied_embeddings=true",
               "parallel.dp_shared_memory=false",
               std::string("parallel.dp_head_blocks=") + (blocks ? "true" : "false")});
    parallel::Mesh mesh(config.layout);
    Trainer trainer(config, nullptr, mesh);
    for (int step = 0; step < 2; ++step) trainer.train_step();
    const HeadRowStepper* head = trainer.head_stepper();
    ASSERT_NE(head, nullptr);
    const int64_t rows = trainer.parameters().all()[head->index()].value.size(0);
    const int64_t per_block = head->block_rows(rows);
    ASSERT_GT(rows, per_block);
    EXPECT_EQ(head->blocks_reduced(), blocks ? (rows + per_block - 1) / per_block : 1)
        << "blocks " << blocks;
    for (const auto& p : trainer.parameters().all()) by_mode[blocks].push_back(p.value.clone());
  }
  for (size_t i = 0; i < by_mode[0].size(); ++i)
    EXPECT_TRUE(torch::allclose(by_mode[1][i], by_mode[0][i], 1e-6, 1e-7))
        << "parameter " << i << " after 2 steps: head in blocks against whole";
}

TEST(TrainerMpi, CheckpointReshardsAcrossLayouts) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = retort::testing::shared_scratch_dir("reshard");
  TrainConfig a_config = small({"parallel.tensor=2", "parallel.sequence_parallel=true",
                                "optimizer.zero_stage=1", "run.dir=" + dir, "training.steps=4"});
  parallel::Mesh a_mesh(a_config.layout);
  Trainer a(a_config, nullptr, a_mesh);
  a.train_step();
  a.train_step();
  const std::string path = checkpoint_path(dir, 2);
  a.save(path);
  MPI_Barrier(MPI_COMM_WORLD);
  // The checkpoint holds global tensors equal to the gathered shards of layout A.
  retort::test::expect_checkpoint_holds_parameters(path, a);
  const CheckpointReader reader(path);
  // Resume under TP4 (no DP, no ZeRO): same parameters, and the next step's loss agrees.
  TrainConfig b_config =
      small({"parallel.tensor=4", "run.dir=" + dir, "training.steps=4", "checkpoint.load=" + path});
  parallel::Mesh b_mesh(b_config.layout);
  Trainer b(b_config, nullptr, b_mesh);
  EXPECT_EQ(b.step(), 2);
  for (auto& p : b.parameters().all()) {
    torch::Tensor stored = reader.parameter(p.spec.name);
    EXPECT_TRUE(torch::equal(to_global(p.value, p.spec, b.tensor_parallel()), stored))
        << p.spec.name;
    torch::Tensor state = reader.tensor("optimizer/exp_avg_sq/" + p.spec.name);
    const auto& s = b.optimizer().states()[&p - &b.parameters().all()[0]];
    EXPECT_TRUE(torch::equal(to_global(s.exp_avg_sq, p.spec, b.tensor_parallel()), state))
        << p.spec.name;
  }
  const double loss_a = a.train_step().loss, loss_b = b.train_step().loss;
  EXPECT_NEAR(loss_b, loss_a, 1e-5 * loss_a);
}

// GradientSync reports each parameter once its gradient is final (what an optimizer step
// inside backward needs): every trainable parameter this rank steps, exactly once per step,
// and nothing changes its gradient afterwards; under ZeRO-1 only the owner's.
TEST(TrainerMpi, GradientSyncReportsEachOwnedParameterOnceFinal) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const char* zero : {"optimizer.zero_stage=0", "optimizer.zero_stage=1"}) {
    TrainConfig config =
        small({"parallel.tensor=2", "parallel.data=2", "parallel.sequence_parallel=true",
               "parallel.dp_bucket_mb=0.02", zero});
    parallel::Mesh mesh(config.layout);
    Trainer trainer(config, nullptr, mesh);
    GradientSync& sync = trainer.gradient_sync();
    std::map<size_t, torch::Tensor> reported;  // parameter -> its gradient when reported
    sync.set_on_final([&](size_t i) {
      EXPECT_EQ(reported.count(i), 0u) << "reported twice: " << i;
      reported[i] = trainer.parameters().all()[i].value.grad().clone();
    });
    StepInspector inspector;
    inspector.on_gradients = [&](const StepResult&) {
      for (size_t i = 0; i < trainer.parameters().all().size(); ++i) {
        const layers::Parameter& p = trainer.parameters().all()[i];
        const bool steps_here = !p.spec.frozen() && sync.owns(i);
        ASSERT_EQ(reported.count(i), size_t(steps_here)) << p.spec.name << " (" << zero << ")";
        if (steps_here)
          EXPECT_TRUE(torch::equal(reported[i], p.value.grad()))
              << p.spec.name << " changed after it was reported final (" << zero << ")";
      }
    };
    trainer.set_inspector(&inspector);
    trainer.train_step();
    EXPECT_FALSE(reported.empty());
  }
}
