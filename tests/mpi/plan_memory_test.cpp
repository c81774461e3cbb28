// tests/mpi/plan_memory_test.cpp: the planner's memory (engine/plan/plan.h) against the
// tracking allocator (engine/observe/memory_tracker.h) over real training steps, for each
// activation checkpointing mode, in fp32 and bf16 mixed precision (its weight copies kept, and
// cast at each use): on one rank, under STP2 and
// on each stage of PP2, saved activations (the category's own peak) and the whole peak within
// 10%. Each trainer, once gone, leaves no memory held.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "engine/observe/memory_tracker.h"
#include "engine/plan/plan.h"
#include "engine/train/trainer.h"
#include "kernels/dispatch.h"
#include "trainer_test_support.h"

using namespace retort;
using namespace retort::engine;

TEST(PlanMemory, PredictedActivationsAndPeakAreWithinTenPercentOfTheTracker) {
  if (kernels::kernel_mode_for(kernels::KernelMode::automatic) == kernels::KernelMode::aten)
    GTEST_SKIP() << "the planner models what Retort's own kernels keep for backward; "
                    "RETORT_KERNELS=aten routes every operation to ATen, which keeps more";
  MemoryTracker& tracker = MemoryTracker::install();
  std::vector<std::vector<std::string>> layouts = {{}};
  if (retort::test::world_size() == 2)
    layouts = {{"parallel.pipeline=2"}, {"parallel.tensor=2", "parallel.sequence_parallel=true"}};
  for (const std::vector<std::string>& layout : layouts)
    for (const char* dtype : {"float32", "bfloat16", "bfloat16 copies per use"})
      for (const char* mode : {"none", "selective", "full"}) {
        std::vector<std::string> keys = {"model.layers=4",
                                         "model.hidden=128",
                                         "model.ffn_hidden=344",
                                         "data.seq_len=128",
                                         "training.micro_batch=4",
                                         "training.global_batch=8",
                                         std::string("memory.activation_checkpointing=") + mode};
        keys.push_back(std::string("model.dtype=") + (dtype[0] == 'f' ? "float32" : "bfloat16"));
        if (std::string(dtype) == "bfloat16 copies per use")
          keys.push_back("memory.keep_compute_weights=false");
        keys.insert(keys.end(), layout.begin(), layout.end());
        const TrainConfig config = retort::test::small_trainer_config(keys);
        tracker.reset_peak();
        const int64_t before = tracker.current_bytes();
        MemorySplit activations, peak_split;
        int64_t peak = 0;
        PlanMemory planned;
        {
          parallel::Mesh mesh(config.layout);
          Trainer trainer(config, nullptr, mesh);
          for (int step = 0; step < 2; ++step) trainer.train_step();
          peak = tracker.peak_bytes() - before;
          activations = tracker.category_peaks();
          peak_split = tracker.peak_split();
          const parallel::MeshCoordinates& c = mesh.coordinates();
          planned = plan_memory(config, {c.tp, c.pp, c.dp});
        }
        // A trainer leaves nothing behind (its 16-bit weight copies included), so the next
        // one's peak is measured from a clean start.
        EXPECT_EQ(tracker.current_bytes(), before)
            << parallel::describe(config.layout) << " " << dtype << " " << mode;
        const double measured_activations = double(activations.of(MemoryCategory::activations));
        std::printf(
            "%s rank %d, %s, checkpointing %s: activations planned %lld, measured %lld; total "
            "planned %lld, "
            "measured peak %lld (parameters %lld, compute weights %lld, gradients %lld, "
            "optimizer %lld, activations %lld, other %lld)\n",
            parallel::describe(config.layout).c_str(), retort::test::world_rank(), dtype, mode,
            (long long)planned.activations, (long long)measured_activations,
            (long long)planned.total(), (long long)peak,
            (long long)peak_split.of(MemoryCategory::parameters),
            (long long)peak_split.of(MemoryCategory::compute_weights),
            (long long)peak_split.of(MemoryCategory::gradients),
            (long long)peak_split.of(MemoryCategory::optimizer_state),
            (long long)peak_split.of(MemoryCategory::activations),
            (long long)peak_split.of(MemoryCategory::other));
        EXPECT_NEAR(double(planned.activations), measured_activations, 0.1 * measured_activations)
            << parallel::describe(config.layout) << " " << dtype << " " << mode;
        EXPECT_NEAR(double(planned.total()), double(peak), 0.1 * double(peak))
            << parallel::describe(config.layout) << " " << dtype << " " << mode;
      }
}
