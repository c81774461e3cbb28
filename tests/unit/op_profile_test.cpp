// tests/unit/op_profile_test.cpp: the op profile counts every call of each op and splits time
// into self times that do not overlap: nested ops (matmul calling mm) are not counted twice,
// so the self times add up to no more than the wall time of the work.
#include "engine/observe/op_profile.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>

using namespace retort::engine;

TEST(OpProfile, CountsCallsAndSelfTimesDoNotOverlap) {
  torch::Tensor a = torch::randn({384, 384}), b = torch::randn({384, 384});
  const auto start = std::chrono::steady_clock::now();
  const std::vector<OpTime> ops = profile_ops([&] {
    for (int i = 0; i < 3; ++i) torch::matmul(a, b).exp_();
  });
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  double total = 0;
  int64_t mm_calls = 0, matmul_calls = 0, exp_calls = 0;
  for (const OpTime& op : ops) {
    EXPECT_GE(op.self_ms, 0) << op.name;
    total += op.self_ms;
    if (op.name == "aten::mm") mm_calls = op.calls;
    if (op.name == "aten::matmul") matmul_calls = op.calls;
    if (op.name == "aten::exp_") exp_calls = op.calls;
  }
  EXPECT_EQ(mm_calls, 3);
  EXPECT_EQ(matmul_calls, 3);
  EXPECT_EQ(exp_calls, 3);
  EXPECT_LE(total, wall_ms);
  EXPECT_EQ(op_family("aten::addmm"), "matrix products");
  EXPECT_EQ(op_family("aten::exp_"), "aten::exp_");
  for (size_t i = 1; i < ops.size(); ++i) EXPECT_GE(ops[i - 1].self_ms, ops[i].self_ms);
}
