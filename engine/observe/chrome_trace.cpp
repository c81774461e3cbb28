// engine/observe/chrome_trace.cpp: see chrome_trace.h.
#include "engine/observe/chrome_trace.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "common/make_directories.h"
#include "common/user_error.h"

namespace retort::engine {
namespace fs = std::filesystem;
namespace profiler = torch::autograd::profiler;

void ChromeTrace::start() {
  profiler::enableProfilerLegacy(
      torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU));
  running_ = true;
}

std::string ChromeTrace::stop_and_write(const std::string& dir, parallel::Communicator& world) {
  const profiler::thread_event_lists lists = profiler::disableProfilerLegacy();
  running_ = false;
  // Ranges nest per thread: pair each push with its pop.
  nlohmann::json events = nlohmann::json::array();
  for (const auto& thread_events : lists) {
    std::vector<const profiler::LegacyEvent*> open;
    for (const profiler::LegacyEvent& e : thread_events) {
      if (e.kind() == profiler::EventKind::PushRange) {
        open.push_back(&e);
      } else if (e.kind() == profiler::EventKind::PopRange && !open.empty()) {
        const profiler::LegacyEvent* begin = open.back();
        open.pop_back();
        const std::string name = begin->name();
        const bool ours = name.rfind("comm ", 0) == 0 || name.rfind("retort ", 0) == 0;
        events.push_back({{"name", name},
                          {"cat", name.rfind("comm ", 0) == 0 ? "communication"
                                  : ours                      ? "retort"
                                                              : "op"},
                          {"ph", "X"},
                          {"ts", begin->cpuUs()},
                          {"dur", begin->cpuElapsedUs(e)},
                          {"pid", world.rank()},
                          {"tid", begin->threadId()}});
      }
    }
  }
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", world.rank()},
                    {"args", {{"name", "rank " + std::to_string(world.rank())}}}});
  make_directories(dir);
  char file[32];
  std::snprintf(file, sizeof(file), "trace_rank_%05d.json", world.rank());
  {
    std::ofstream out(fs::path(dir) / file);
    out << nlohmann::json{{"traceEvents", events}}.dump();
    if (!out)
      throw UserError("cannot write the trace file '" + (fs::path(dir) / file).string() + "'");
  }
  world.barrier();
  if (world.rank() != 0) return "";
  nlohmann::json merged = nlohmann::json::array();
  for (int r = 0; r < world.size(); ++r) {
    std::snprintf(file, sizeof(file), "trace_rank_%05d.json", r);
    std::ifstream in(fs::path(dir) / file);
    nlohmann::json rank_trace = nlohmann::json::parse(in);
    for (auto& e : rank_trace.at("traceEvents")) merged.push_back(std::move(e));
  }
  const std::string path = (fs::path(dir) / "trace.json").string();
  std::ofstream out(path);
  out << nlohmann::json{{"traceEvents", merged}, {"displayTimeUnit", "ms"}}.dump();
  return path;
}

}  // namespace retort::engine
