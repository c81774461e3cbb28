// tests/mpi/plan_time_test.cpp: the planner's step-time model (engine/plan/plan.h) against
// FLOP counts derived by hand for the test model: the LM head's three products (logits, d/dx,
// d/dW; 2 V h FLOPs each per token) run in forward in the fused head, so backward, the window
// the DP buckets overlap, holds the blocks' share only; parallel.dp_head_blocks moves the
// logits (again) and d/dW into backward; a distillation teacher's forward adds to the step
// but not to that window. Timings are not involved: bench/slow_link.sh sets the model
// against a run.
#include <gtest/gtest.h>

#include "engine/config/config.h"
#include "engine/plan/plan.h"
#include "trainer_test_support.h"

using namespace retort;
using namespace retort::engine;

namespace {

// The small test model (tied) planned for DP2.
TrainConfig planned(std::vector<std::string> keys) {
  keys.push_back("model.tied_embeddings=true");
  return retort::test::small_trainer_config(keys, 2);
}

ClusterShape two_hosts() {
  ClusterShape cluster{2, 1, device_kind("cpu")};
  cluster.device.tflops = 1e-3;  // 1 GFLOP/s: seconds are GFLOPs
  cluster.device.efficiency = 1;
  return cluster;
}

}  // namespace

TEST(PlanTime, HeadProductsAndTeacherLandWhereRetortRunsThem) {
  const TrainConfig whole = planned({});
  const double V = double(whole.model.vocab_size), h = double(whole.model.hidden);
  // Per rank: 4 sequences of 32 tokens (DP2), the last micro-batch 2 of them.
  const double tokens = 4 * 32, last = 2 * 32, gflop = 1e-9;
  const double student = whole.model.training_flops_per_token(32);
  const PlanTime plain = plan_time(whole, two_hosts());
  EXPECT_NEAR(plain.compute_s, student * tokens * gflop, 1e-9);
  EXPECT_NEAR(plain.backward_window_s, (student - 6 * V * h) * 2 / 3 * last * gflop, 1e-9);
  // Exposed: what of the DP sum's wire time the window does not cover.
  EXPECT_NEAR(plain.dp_exposed_s, std::max(0.0, plain.dp_s - plain.backward_window_s), 1e-12);

  const PlanTime blocks = plan_time(planned({"parallel.dp_head_blocks=true"}), two_hosts());
  EXPECT_NEAR(blocks.compute_s - plain.compute_s, 2 * V * h * tokens * gflop, 1e-9);
  EXPECT_NEAR(blocks.backward_window_s - plain.backward_window_s, 4 * V * h * last * gflop, 1e-9);
  EXPECT_EQ(blocks.dp_s, plain.dp_s);

  const TrainConfig distilling =
      planned({"distill.logit_weight=1", "teacher.layers=4", "teacher.hidden=128",
               "teacher.heads=8", "teacher.kv_heads=2", "teacher.ffn_hidden=256"});
  ASSERT_TRUE(distilling.distill.enabled);
  const PlanTime taught = plan_time(distilling, two_hosts());
  EXPECT_NEAR(taught.compute_s - plain.compute_s,
              distilling.distill.teacher.training_flops_per_token(32) / 3 * tokens * gflop, 1e-9);
  EXPECT_NEAR(taught.backward_window_s, plain.backward_window_s, 1e-12);
}
