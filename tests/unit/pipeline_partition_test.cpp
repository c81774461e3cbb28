// tests/unit/pipeline_partition_test.cpp: layer ranges per pipeline stage: the even split,
// an explicit split and its refusals, and the teacher split that keeps every distillation
// pair on one stage.
#include "parallel/pipeline_partition.h"

#include <gtest/gtest.h>

#include "common/user_error.h"

using namespace retort::parallel;
using retort::UserError;

namespace {
std::vector<int64_t> sizes(const std::vector<LayerRange>& ranges) {
  std::vector<int64_t> out;
  int64_t expected_first = 0;
  for (const LayerRange& r : ranges) {
    EXPECT_EQ(r.first, expected_first);  // contiguous, in order
    expected_first = r.end;
    out.push_back(r.size());
  }
  return out;
}
}  // namespace

TEST(PipelinePartition, EvenSplitGivesTheRemainderToTheFirstStages) {
  EXPECT_EQ(sizes(split_layers(8, 4)), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(sizes(split_layers(5, 4)), (std::vector<int64_t>{2, 1, 1, 1}));
  EXPECT_EQ(sizes(split_layers(7, 3)), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(sizes(split_layers(3, 1)), (std::vector<int64_t>{3}));
}

TEST(PipelinePartition, ExplicitSplitIsUsedAndChecked) {
  auto ranges = split_layers(5, 4, {1, 2, 1, 1});
  EXPECT_EQ(sizes(ranges), (std::vector<int64_t>{1, 2, 1, 1}));
  EXPECT_EQ(stage_of_layer(ranges, 0), 0);
  EXPECT_EQ(stage_of_layer(ranges, 2), 1);
  EXPECT_EQ(stage_of_layer(ranges, 4), 3);
  EXPECT_THROW(split_layers(5, 4, {1, 2, 2}), UserError);     // wrong number of stages
  EXPECT_THROW(split_layers(5, 4, {1, 2, 1, 2}), UserError);  // sums to 6
  EXPECT_THROW(split_layers(5, 4, {0, 3, 1, 1}), UserError);  // an empty stage
  EXPECT_THROW(split_layers(3, 4), UserError);                // fewer layers than stages
  try {
    split_layers(5, 2, {1, 3});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pipeline_split sums to 4"), std::string::npos)
        << e.what();
  }
}

TEST(PipelinePartition, PinnedSplitKeepsEveryPairOnItsStage) {
  // No pins: the even split (empty stages allowed when layers < stages).
  EXPECT_EQ(sizes(split_layers_pinned(8, 2, {})), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(sizes(split_layers_pinned(3, 4, {})), (std::vector<int64_t>{1, 1, 1, 0}));
  // Teacher layer 2 must run on stage 1 although the even split puts it on stage 2.
  auto ranges = split_layers_pinned(3, 4, {{0, 0}, {1, 2}});
  EXPECT_EQ(stage_of_layer(ranges, 0), 0);
  EXPECT_EQ(stage_of_layer(ranges, 2), 1);
  EXPECT_EQ(sizes(ranges), (std::vector<int64_t>{1, 2, 0, 0}));
  // A deep teacher: 8 layers, pin layer 7 to stage 0 of 2: everything moves to stage 0.
  EXPECT_EQ(sizes(split_layers_pinned(8, 2, {{0, 7}})), (std::vector<int64_t>{8, 0}));
  // Every pin is honoured for random consistent pins.
  for (int stages : {2, 3, 4})
    for (int64_t layers : {3, 6, 9})
      for (int64_t l = 1; l < layers; ++l) {
        std::vector<std::pair<int, int64_t>> pins = {{0, 0}, {stages - 1, l}};
        auto r = split_layers_pinned(layers, stages, pins);
        EXPECT_EQ(stage_of_layer(r, 0), 0);
        EXPECT_EQ(stage_of_layer(r, l), stages - 1);
      }
  // Crossed pins cannot be met: layer 1 before stage 1's layer 0.
  EXPECT_THROW(split_layers_pinned(4, 2, {{1, 0}, {0, 1}}), UserError);
}
