// parallel/device_watchdog.cpp: see device_watchdog.h.
//
// Liveness (liveness_probes.h) on the device watchdogs' own communicator: each process's
// watchdog thread answers with the oldest device operation it waits for.
#include "parallel/device_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>

#include "parallel/collective_watchdog.h"
#include "parallel/liveness_probes.h"

namespace retort::parallel {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kLineBytes = 200;
constexpr double kGraceWhenAllAnswered = 0.5;  // as collective_watchdog.cpp, for the same reason
constexpr auto kPollInterval = std::chrono::milliseconds(1);

std::string join(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  return text;
}

}  // namespace

struct DeviceWatchdog::TrackedOp {
  long serial = 0;
  int group_id = 0;
  std::string op;
  std::function<DeviceOpPoll()> poll;
  Clock::time_point start;
};

struct DeviceWatchdog::State {
  MPI_Comm liveness = MPI_COMM_NULL;
  std::function<double()> timeout_seconds;
  std::function<void(const std::string&)> end_job;
  bool can_probe = false;
  int my_rank = 0;

  std::mutex mutex;  // groups and ops: the caller's thread adds, the watchdog's polls
  std::map<int, Group> groups;
  int next_group_id = 0;
  long next_serial = 0;
  std::deque<TrackedOp> ops;  // in the order they were issued

  // The liveness round of the oldest pending operation (serial -1: none yet).
  long probed_serial = -1;
  std::vector<std::pair<int, std::string>> answers;
  LivenessAnswers sent_answers;

  std::string describe_wait(Clock::time_point now) const {
    char text[kLineBytes];
    if (ops.empty()) {
      std::snprintf(text, sizeof(text), "rank %d waits in no device operation", my_rank);
    } else {
      const TrackedOp& oldest = ops.front();
      auto group = groups.find(oldest.group_id);
      std::snprintf(text, sizeof(text), "rank %d waits in %s on group '%s' for %.1f s", my_rank,
                    oldest.op.c_str(), group != groups.end() ? group->second.name.c_str() : "?",
                    std::chrono::duration<double>(now - oldest.start).count());
    }
    return text;
  }

  // One line: what failed and why, every communicator aborted first.
  std::string fail(const std::string& op, int group_id, const std::string& why) {
    const auto group = groups.find(group_id);
    const std::string name = group != groups.end() ? group->second.name : "?";
    const std::string ranks = group != groups.end() ? join(group->second.world_ranks) : "?";
    for (auto& [id, g] : groups)
      if (g.abort) g.abort();
    char head[512];
    std::snprintf(head, sizeof(head), "retort: rank %d: %s on group '%s' (world ranks %s) ",
                  my_rank, op.c_str(), name.c_str(), ranks.c_str());
    return head + why + "; aborted " + std::to_string(groups.size()) +
           " NCCL communicator(s), ending the job.";
  }

  // The report when the oldest operation is past the timeout, or "" while it may wait on.
  std::string check_timeout(Clock::time_point now) {
    const double timeout = timeout_seconds ? timeout_seconds() : 0;
    if (timeout <= 0 || ops.empty()) return "";
    const TrackedOp& oldest = ops.front();
    const double waited = std::chrono::duration<double>(now - oldest.start).count();
    const auto group = groups.find(oldest.group_id);
    const std::vector<int> members =
        group != groups.end() ? group->second.world_ranks : std::vector<int>{};
    if (can_probe && waited >= 0.5 * timeout && probed_serial != oldest.serial) {
      probed_serial = oldest.serial;
      answers.clear();
      send_probes(liveness, members, my_rank);
    }
    if (can_probe) collect_answers(liveness, answers);
    const std::vector<int> no_answer = silent_members(members, my_rank, answers);
    const bool whole_group_answered = can_probe && no_answer.empty();
    if (waited < timeout ||
        (whole_group_answered && waited < (1 + kGraceWhenAllAnswered) * timeout))
      return "";
    char limit[96];
    std::snprintf(limit, sizeof(limit),
                  "did not complete within runtime.collective_timeout_s=%g s: ", timeout);
    std::string why = limit;
    if (!can_probe) {
      why += "no liveness probes (MPI without MPI_THREAD_MULTIPLE); it waits for rank(s) " +
             join(members);
    } else if (!no_answer.empty()) {
      why += "no answer from rank(s) " + ranks_with_hosts(no_answer) +
             " of that group: dead or not responding (frozen, deadlocked)";
    } else {
      const std::string here =
          "on group '" + (group != groups.end() ? group->second.name : std::string("?")) + "'";
      bool all_here = true;
      for (const auto& a : answers) all_here &= a.second.find(here) != std::string::npos;
      why += all_here ? "every member answered and waits in this group (a deadlock of the "
                        "order its operations were issued in)"
                      : "every member answered; the stall is in another group";
    }
    for (const auto& a : answers) why += "; " + a.second;
    return fail(oldest.op, oldest.group_id, why);
  }

  // Polls groups and operations; the report if the job must end, else "".
  std::string poll(Clock::time_point now) {
    // No group, no MPI: the process may be past MPI_Finalize (its backends gone first).
    if (groups.empty()) return "";
    for (auto& [id, g] : groups) {
      const std::string error = g.async_error ? g.async_error() : "";
      if (error.empty()) continue;
      std::string op = "communicator";
      for (const TrackedOp& t : ops)
        if (t.group_id == id) {
          op = t.op;
          break;
        }
      return fail(op, id, "failed: " + error);
    }
    for (auto it = ops.begin(); it != ops.end();) {
      const DeviceOpPoll state = it->poll();
      if (state.state == DeviceOpState::failed)
        return fail(it->op, it->group_id, "failed: " + state.reason);
      it = state.state == DeviceOpState::done ? ops.erase(it) : std::next(it);
    }
    if (can_probe) answer_probes(liveness, describe_wait(now), sent_answers);
    return check_timeout(now);
  }
};

DeviceWatchdog::DeviceWatchdog(MPI_Comm liveness, std::function<double()> timeout_seconds,
                               std::function<void(const std::string&)> end_job)
    : state_(std::make_unique<State>()) {
  state_->liveness = liveness;
  state_->timeout_seconds = std::move(timeout_seconds);
  state_->end_job = std::move(end_job);
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  state_->can_probe = liveness != MPI_COMM_NULL && provided == MPI_THREAD_MULTIPLE;
  MPI_Comm_rank(MPI_COMM_WORLD, &state_->my_rank);
  thread_ = std::thread([this] { run(); });
}

DeviceWatchdog::~DeviceWatchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

int DeviceWatchdog::add_group(Group group) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const int id = state_->next_group_id++;
  state_->groups.emplace(id, std::move(group));
  return id;
}

void DeviceWatchdog::remove_group(int group_id) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->groups.erase(group_id);
  auto& ops = state_->ops;
  ops.erase(std::remove_if(ops.begin(), ops.end(),
                           [&](const TrackedOp& t) { return t.group_id == group_id; }),
            ops.end());
}

void DeviceWatchdog::track(int group_id, std::string op, std::function<DeviceOpPoll()> poll) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  TrackedOp tracked;
  tracked.serial = state_->next_serial++;
  tracked.group_id = group_id;
  tracked.op = std::move(op);
  tracked.poll = std::move(poll);
  tracked.start = Clock::now();
  state_->ops.push_back(std::move(tracked));
}

void DeviceWatchdog::run() {
  while (!stop_) {
    std::string report;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      report = state_->poll(Clock::now());
    }
    if (!report.empty()) {
      ended_ = true;
      state_->end_job(report);
      return;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

DeviceWatchdog& DeviceWatchdog::process() {
  static DeviceWatchdog watchdog(
      device_liveness_communicator(), [] { return collective_timeout(); },
      [](const std::string& report) {
        std::fprintf(stderr, "%s\n", report.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 4);
        std::abort();  // MPI_Abort does not return
      });
  return watchdog;
}

}  // namespace retort::parallel
