// tests/mpi/checkpoint_reshard_test.cpp (8 ranks): a checkpoint saved under TP2 x PP2 x DP2
// loads under TP1 (DP8), STP4 (x DP2), PP2 (x DP4) and TP2 x DP4 with ZeRO-1, and the next two
// steps' losses equal those of continuing in the original layout (relative 1e-5): parameters
// and optimizer state both travel. Memory, from the tracking allocator: during the save, and
// during the load into a trainer of each layout, no rank's tensor memory grows by more than
// the largest tensor plus 10% of its own shards and that tensor, so its peak stays within its
// own shards plus the largest tensor plus 10%.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>

#include "engine/config/config.h"
#include "engine/observe/memory_tracker.h"
#include "tests/mpi/trainer_test_support.h"
#include "tests/support/shared_scratch_dir.h"

using namespace retort;
using namespace retort::engine;
using retort::test::world_rank;
using retort::test::world_size;

namespace {

TrainConfig config(std::vector<std::string> overrides) {
  std::vector<std::string> all = {"training.micro_batch=1", "training.steps=4"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return retort::test::small_trainer_config(all);
}

// Bytes of this rank's shards: parameters and the optimizer state it holds.
int64_t own_shard_bytes(Trainer& t) {
  int64_t bytes = 0;
  for (size_t i = 0; i < t.parameters().all().size(); ++i) {
    bytes += t.parameters().all()[i].value.nbytes();
    const auto& s = t.optimizer().states()[i];
    if (s.exp_avg.defined()) bytes += s.exp_avg.nbytes() + s.exp_avg_sq.nbytes();
  }
  return bytes;
}

int64_t largest_tensor_bytes(const layers::ModelConfig& model) {
  layers::ParameterStore store(1, torch::kFloat);
  layers::LlamaModel whole(model, store);
  int64_t largest = 0;
  for (const auto& p : store.all()) largest = std::max(largest, p.spec.numel() * 4);
  return largest;
}

}  // namespace

TEST(CheckpointReshard, SavedUnderTp2Pp2Dp2LoadsUnderFourOtherLayouts) {
  if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  MemoryTracker& memory = MemoryTracker::install();
  // RETORT_KEEP_RUN_DIR (set by CTest): a folder to keep the run in, whose checkpoint
  // checkpoint_reads_with_h5py then reads; else a scratch folder of its own.
  const char* keep = std::getenv("RETORT_KEEP_RUN_DIR");
  std::string dir;
  if (keep && *keep) {
    dir = keep;
    if (world_rank() == 0) std::filesystem::remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    dir = retort::testing::shared_scratch_dir("reshard8");
  }
  const TrainConfig a_config =
      config({"parallel.tensor=2", "parallel.pipeline=2", "run.dir=" + dir});
  const int64_t largest = largest_tensor_bytes(a_config.model);
  std::vector<double> continued;
  const std::string path = checkpoint_path(dir, 2);
  {
    parallel::Mesh a_mesh(a_config.layout);
    Trainer a(a_config, nullptr, a_mesh);
    a.train_step();
    a.train_step();
    memory.reset_peak();
    const int64_t before = memory.current_bytes();
    a.save(path);
    const int64_t growth = memory.peak_bytes() - before;
    EXPECT_LE(growth, largest + (own_shard_bytes(a) + largest) / 10)
        << "save grew tensor memory by " << growth << " bytes";
    continued.push_back(a.train_step().loss);
    continued.push_back(a.train_step().loss);
  }
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.tensor=1"},
      {"parallel.tensor=4", "parallel.sequence_parallel=true"},
      {"parallel.pipeline=2"},
      {"parallel.tensor=2", "optimizer.zero_stage=1"}};
  for (std::vector<std::string> keys : layouts) {
    keys.push_back("run.dir=" + dir);
    {  // The load alone, into a fresh trainer of the layout: what it adds to tensor memory.
      const TrainConfig c_config = config(keys);
      parallel::Mesh c_mesh(c_config.layout);
      Trainer c(c_config, nullptr, c_mesh);
      memory.reset_peak();
      const int64_t before = memory.current_bytes();
      load_checkpoint(path, c_mesh, c.parameters(), &c.optimizer());
      const int64_t growth = memory.peak_bytes() - before, own = own_shard_bytes(c);
      EXPECT_LE(growth, largest + (own + largest) / 10)
          << keys.front() << ": load grew tensor memory by " << growth << " bytes; own shards "
          << own << ", largest tensor " << largest;
    }
    keys.push_back("checkpoint.load=" + path);
    const TrainConfig b_config = config(keys);
    parallel::Mesh b_mesh(b_config.layout);
    Trainer b(b_config, nullptr, b_mesh);
    EXPECT_EQ(b.step(), 2) << keys.front();
    for (double want : continued) {
      const double got = b.train_step().loss;
      EXPECT_NEAR(got, want, 1e-5 * want) << keys.front() << " " << keys[1];
    }
  }
}
