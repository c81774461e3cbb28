// tests/unit/pipeline_schedule_test.cpp: the 1F1B schedule alone: the exact order of
// forwards and backwards per stage, every micro-batch once each way with its forward before
// its backward, and at most p - stage micro-batches in flight.
#include <gtest/gtest.h>

#include "parallel/pipeline_schedule.h"

using namespace retort::parallel;

TEST(PipelineSchedule, OrderPerStageForFourStages) {
  EXPECT_EQ(describe(one_forward_one_backward(4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(describe(one_forward_one_backward(4, 2, 6)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(describe(one_forward_one_backward(4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: all forwards, then all backwards.
  EXPECT_EQ(describe(one_forward_one_backward(4, 0, 2)), "F0 F1 B0 B1");
}

TEST(PipelineSchedule, EveryMicroBatchOnceAndBoundedInFlight) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 4, 8, 13})
      for (int s = 0; s < p; ++s) {
        auto actions = one_forward_one_backward(p, s, m);
        ASSERT_EQ(int(actions.size()), 2 * m);
        std::vector<int> forward_at(m, -1), backward_at(m, -1);
        for (int i = 0; i < int(actions.size()); ++i)
          (actions[i].kind == PipelineAction::Forward ? forward_at : backward_at)
              [actions[i].micro_batch] = i;
        for (int k = 0; k < m; ++k) {
          EXPECT_GE(forward_at[k], 0);
          EXPECT_GT(backward_at[k], forward_at[k]);
          if (k > 0) EXPECT_GT(backward_at[k], backward_at[k - 1]);  // backwards in order
        }
        EXPECT_LE(max_in_flight(actions), p - s) << "p " << p << " stage " << s << " m " << m;
        EXPECT_EQ(max_in_flight(actions), std::min(p - s, m));
      }
}
