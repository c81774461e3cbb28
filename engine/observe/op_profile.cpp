// engine/observe/op_profile.cpp: see op_profile.h.
#include "engine/observe/op_profile.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <map>

namespace retort::engine {

std::vector<OpTime> profile_ops(const std::function<void()>& work) {
  namespace profiler = torch::autograd::profiler;
  profiler::enableProfilerLegacy(
      torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU));
  work();
  const profiler::thread_event_lists lists = profiler::disableProfilerLegacy();
  std::map<std::string, OpTime> by_name;
  for (const auto& events : lists) {
    // Ranges nest per thread: a stack of open ranges, each with the time of its children.
    struct Open {
      const profiler::LegacyEvent* start;
      double children_us;
    };
    std::vector<Open> stack;
    for (const profiler::LegacyEvent& e : events) {
      if (e.kind() == profiler::EventKind::PushRange) {
        stack.push_back({&e, 0});
      } else if (e.kind() == profiler::EventKind::PopRange && !stack.empty()) {
        const Open open = stack.back();
        stack.pop_back();
        const double elapsed = open.start->cpuElapsedUs(e);
        OpTime& t = by_name[open.start->name()];
        t.name = open.start->name();
        t.self_ms += (elapsed - open.children_us) / 1e3;
        t.calls += 1;
        if (!stack.empty()) stack.back().children_us += elapsed;
      }
    }
  }
  std::vector<OpTime> ops;
  for (auto& [name, t] : by_name) ops.push_back(t);
  std::sort(ops.begin(), ops.end(),
            [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return ops;
}

std::string op_family(const std::string& name) {
  for (const char* mm : {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
                         "aten::baddbmm_", "aten::dot", "aten::addmv", "aten::mv"})
    if (name == mm) return "matrix products";
  return name;
}

}  // namespace retort::engine
