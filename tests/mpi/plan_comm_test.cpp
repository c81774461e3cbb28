// tests/mpi/plan_comm_test.cpp: the planner's bytes per step (engine/plan/plan.h) against the
// communicators' own counters after a real training step, on every rank, exactly: per group
// and operation, for TP, STP, PP (tied and untied embeddings), DP, ZeRO-1, full activation
// checkpointing, bf16, and on 8 ranks a 3D layout. The first step is left out (it can
// differ: nothing is measured then), the second counted.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <sstream>

#include "engine/config/config.h"
#include "engine/plan/plan.h"
#include "engine/train/trainer.h"
#include "trainer_test_support.h"

using namespace retort;
using namespace retort::engine;
using retort::test::world_size;

namespace {

struct PlannedLayout {
  int ranks;
  std::vector<std::string> keys;
};

std::string text(const std::map<std::string, int64_t>& bytes) {
  std::ostringstream os;
  for (const auto& [key, n] : bytes) os << " " << key << "=" << n;
  return os.str();
}

}  // namespace

TEST(PlanComm, PredictedBytesPerStepEqualTheCountersOnEveryRank) {
  const std::vector<PlannedLayout> layouts = {
      {4, {"parallel.tensor=2"}},
      {4, {"parallel.tensor=2", "parallel.sequence_parallel=true"}},
      {4,
       {"parallel.tensor=2", "parallel.sequence_parallel=true",
        "memory.activation_checkpointing=full", "model.dtype=bfloat16"}},
      {4,
       {"parallel.tensor=2", "model.kv_heads=1", "model.qkv_bias=true",
        "memory.activation_checkpointing=full"}},
      {4, {"parallel.pipeline=2"}},
      {4, {"parallel.pipeline=2", "model.tied_embeddings=true"}},
      {4, {}},
      {4, {"optimizer.zero_stage=1"}},
      {4, {"parallel.dp_reduce_dtype=bfloat16", "model.dtype=bfloat16"}},  // shared memory
      {4,
       {"parallel.dp_reduce_dtype=bfloat16", "model.dtype=bfloat16",
        "parallel.dp_shared_memory=false"}},
      {8,
       {"parallel.tensor=2", "parallel.pipeline=2", "parallel.sequence_parallel=true",
        "optimizer.zero_stage=1", "model.tied_embeddings=true"}},
  };
  int checked = 0;
  for (const PlannedLayout& layout : layouts) {
    if (layout.ranks != world_size()) continue;
    std::vector<std::string> keys = {"model.layers=4", "training.micro_batch=1"};
    keys.insert(keys.end(), layout.keys.begin(), layout.keys.end());
    const TrainConfig config = retort::test::small_trainer_config(keys);
    parallel::Mesh mesh(config.layout);
    Trainer trainer(config, nullptr, mesh);
    trainer.train_step();
    std::vector<parallel::Communicator*> groups = {&mesh.tp(), &mesh.pp(), &mesh.gradient_reduction(),
                                                   &mesh.model_parallel(), &mesh.world()};
    if (mesh.embedding()) groups.push_back(mesh.embedding());
    for (parallel::Communicator* g : groups) g->reset_counters();
    trainer.train_step();
    std::map<std::string, int64_t> counted;
    for (parallel::Communicator* g : groups)
      for (const auto& [op, counter] : g->counters())
        if (counter.bytes > 0) counted[g->name() + "/" + op] += counter.bytes;
    const parallel::MeshCoordinates& c = mesh.coordinates();
    const std::map<std::string, int64_t> planned =
        plan_communication(config, {c.tp, c.pp, c.dp}, /*ranks_per_host=*/world_size());
    EXPECT_EQ(plan_dp_in_shared_memory(config, world_size()),
              trainer.gradient_sync().reduces_in_shared_memory());
    std::string name;
    for (const std::string& k : layout.keys) name += k + " ";
    EXPECT_EQ(planned, counted) << name << "rank " << mesh.world_rank()
                                << "\n  planned:" << text(planned)
                                << "\n  counted:" << text(counted);
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no layout here for " << world_size() << " ranks";
}
