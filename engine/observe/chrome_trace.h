// engine/observe/chrome_trace.h: logging.profile_steps. Between start() and stop_and_write()
// torch's (legacy) profiler records every op on this rank, together with Retort's own spans
// (TraceSpan: step, forward and backward of each micro-batch, the teacher's blocks, the head
// and loss, the attention forward, gradient sync, optimizer, and every communication wait
// named by operation and group). stop_and_write writes this rank's
// events as Chrome trace JSON (trace event format, "X" complete events, pid = world rank,
// tid = thread) to <dir>/trace_rank_RRRRR.json; then, collectively, world rank 0 merges all
// ranks into <dir>/trace.json (one process per rank; the clocks are the host's monotonic
// clock, shared by the ranks of one host). Open it in chrome://tracing or ui.perfetto.dev.
#pragma once
#include <string>

#include "parallel/communicator.h"

namespace retort::engine {

class ChromeTrace {
 public:
  void start();
  bool running() const { return running_; }
  // Collective over `world`. Returns the merged file's path (on rank 0; empty elsewhere).
  std::string stop_and_write(const std::string& dir, parallel::Communicator& world);

 private:
  bool running_ = false;
};

}  // namespace retort::engine
