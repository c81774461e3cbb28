// engine/observe/op_profile.h: where a piece of work spends its CPU time, op by op: torch's
// profiler (the legacy, in-process one) records every ATen op and autograd node while `work`
// runs, and each op's self time (its time minus that of the ops it called) is summed by
// name. For benchmarks' step breakdowns by op family.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace retort::engine {

struct OpTime {
  std::string name;
  double self_ms = 0;
  int64_t calls = 0;
};

// Ops by self time, largest first.
std::vector<OpTime> profile_ops(const std::function<void()>& work);

// The family of an op name: "matrix products" for mm / addmm(_) / bmm / baddbmm(_) / matmul's
// kernels, else the name itself.
std::string op_family(const std::string& name);

}  // namespace retort::engine
