// parallel/collective_watchdog.cpp: see collective_watchdog.h.
//
// Liveness (liveness_probes.h) on the private communicator: a rank whose wait passed half the
// timeout probes each other member of the waited-on group, once per wait. Every rank, while
// it waits in anything, answers with what it waits in. A frozen process (SIGSTOP, a deadlock
// outside MPI, an endless loop) never answers.
#include "parallel/collective_watchdog.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "parallel/host_names.h"
#include "parallel/liveness_probes.h"

namespace retort::parallel {
namespace {

constexpr int kLineBytes = 200;
// A rank whose whole group answered is stalled behind a rank of another group; the member
// that waits on the silent rank names it at its own timeout. That member may have begun its
// wait a little later (it was still computing while we already waited on it), so a wait
// whose group all answered gives it this fraction of the timeout more before ending the job.
constexpr double kGraceWhenAllAnswered = 0.5;

// How long after a stop signal a wait that has not ended names the ranks it waits for: well
// inside the second mpirun allows between its SIGTERM and its SIGKILL.
constexpr double kStopSignalReportSeconds = 0.1;

MPI_Comm liveness = MPI_COMM_NULL;
MPI_Comm device_liveness = MPI_COMM_NULL;  // device_watchdog.h's own
int (*stop_signal_check)() = nullptr;
bool stop_signal_reported = false;       // once per process: the first wait that outlasts it
std::atomic<double> timeout_seconds{0};  // read by the device watchdog's thread too
int my_rank = 0;
LivenessAnswers sent_answers;
std::vector<std::string> host_of_rank;  // per world rank, MPI's processor name

std::string describe(const WaitLabel& label, double seconds) {
  char text[kLineBytes];
  std::snprintf(text, sizeof(text), "rank %d waits in %s on group '%s' for %.1f s", my_rank,
                label.op, label.group_name ? label.group_name->c_str() : "?", seconds);
  return text;
}

// See ranks_with_hosts.
std::string group_by_host(const std::vector<int>& ranks) {
  std::vector<std::pair<std::string, std::string>> by_host;  // host, its ranks
  for (int r : ranks) {
    const std::string host = size_t(r) < host_of_rank.size() ? host_of_rank[r] : "?";
    auto it = std::find_if(by_host.begin(), by_host.end(),
                           [&](const auto& entry) { return entry.first == host; });
    if (it == by_host.end()) it = by_host.insert(by_host.end(), {host, ""});
    it->second += (it->second.empty() ? "" : ", ") + std::to_string(r);
  }
  std::string text;
  for (const auto& [host, list] : by_host)
    text += (text.empty() ? "" : "; ") + list + " on " + host;
  return text;
}

[[noreturn]] void report_and_abort(const WaitLabel& label, const std::vector<int>& members,
                                   const std::vector<std::pair<int, std::string>>& answers) {
  std::string ranks;
  for (int r : members) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  const std::string silent = group_by_host(silent_members(members, my_rank, answers));
  // Every member waiting in this very group: they issued operations that cannot complete in
  // the order given (a send waiting for a receive that its peer posts only later).
  const std::string here =
      std::string("on group '") + (label.group_name ? *label.group_name : "?") + "'";
  bool all_wait_here = !answers.empty();
  for (const auto& a : answers) all_wait_here &= a.second.find(here) != std::string::npos;
  const std::string why =
      !silent.empty() ? "No answer from rank(s) " + silent +
                            " of that group: dead or not responding (frozen, deadlocked)."
      : all_wait_here ? std::string(
                            "Every member answered and waits in this group: its "
                            "operations were issued in an order that cannot complete "
                            "(a deadlock of the message order).")
                      : std::string("Every member answered; the stall is in another group.");
  std::fprintf(stderr,
               "retort: rank %d: %s on group '%s' (world ranks %s) did not complete within "
               "runtime.collective_timeout_s=%g s. %s\n",
               my_rank, label.op, label.group_name ? label.group_name->c_str() : "?", ranks.c_str(),
               timeout_seconds.load(), why.c_str());
  for (const auto& a : answers) std::fprintf(stderr, "retort:   answer: %s\n", a.second.c_str());
  std::fprintf(stderr, "retort: ending the job.\n");
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 4);
  std::abort();  // MPI_Abort does not return
}

// After a stop signal, in a wait that has not ended: the ranks it waits for, with their hosts.
// No probes here: mpirun is ending the job because a process or a host died, and a first
// connection to a dead process makes MPI's TCP transport end this one before it can report.
void report_wait_on_stop_signal(const WaitLabel& label) {
  std::vector<int> others;
  if (label.group != MPI_COMM_NULL)
    for (int r : world_ranks_of(label.group))
      if (r != my_rank) others.push_back(r);
  std::fprintf(stderr,
               "retort: rank %d got a stop signal while waiting in %s on group '%s' for rank(s) "
               "%s\n",
               my_rank, label.op, label.group_name ? label.group_name->c_str() : "?",
               others.empty() ? "?" : group_by_host(others).c_str());
  std::fflush(stderr);
}

}  // namespace

std::vector<int> world_ranks_of(MPI_Comm group) {
  MPI_Group g, world;
  MPI_Comm_group(group, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int size = 0;
  MPI_Group_size(g, &size);
  std::vector<int> local(size), global(size);
  for (int i = 0; i < size; ++i) local[i] = i;
  MPI_Group_translate_ranks(g, size, local.data(), world, global.data());
  MPI_Group_free(&g);
  MPI_Group_free(&world);
  return global;
}

std::string ranks_with_hosts(const std::vector<int>& ranks) {
  return group_by_host(ranks);
}

MPI_Comm device_liveness_communicator() {
  return device_liveness;
}

void init_collective_watchdog() {
  if (liveness != MPI_COMM_NULL) return;
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  MPI_Comm_dup(MPI_COMM_WORLD, &liveness);
  MPI_Comm_dup(MPI_COMM_WORLD, &device_liveness);
  host_of_rank = gather_host_names(MPI_COMM_WORLD);  // a report names where silent ranks ran
}

void watch_stop_signal(int (*stop_signal_received)()) {
  stop_signal_check = stop_signal_received;
}

void set_collective_timeout(double seconds) {
  timeout_seconds = seconds;
}
double collective_timeout() {
  return timeout_seconds;
}

void wait_or_abort(std::vector<MPI_Request>& requests, const WaitLabel& label) {
  if (timeout_seconds <= 0 || liveness == MPI_COMM_NULL) {
    MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    return;
  }
  wait_or_abort(
      [&] {
        int done = 0;
        MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
        return done != 0;
      },
      label);
}

void wait_or_abort(const std::function<bool()>& done, const WaitLabel& label) {
  if (timeout_seconds <= 0 || liveness == MPI_COMM_NULL) {
    while (!done()) sched_yield();  // ranks may outnumber cores
    return;
  }
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  bool probed = false;
  double stop_signal_at = -1;  // seconds into the wait when a stop signal was first seen
  std::vector<int> members;
  std::vector<std::pair<int, std::string>> answers;
  double previous_poll = 0;
  for (;;) {
    if (done()) return;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited - previous_poll > 0.25 * timeout_seconds) {
      // This process itself did not run for that long (stopped, then continued): its clock
      // says nothing about the others. Start over rather than accuse them.
      std::fprintf(stderr, "retort: rank %d was not running for %.1f s (stopped or starved)\n",
                   my_rank, waited - previous_poll);
      wait_or_abort(done, label);
      return;
    }
    previous_poll = waited;
    answer_probes(liveness, describe(label, waited), sent_answers);
    if (stop_signal_at < 0 && stop_signal_check && stop_signal_check() != 0)
      stop_signal_at = waited;
    if (stop_signal_at >= 0 && !stop_signal_reported &&
        waited >= stop_signal_at + kStopSignalReportSeconds) {
      stop_signal_reported = true;
      report_wait_on_stop_signal(label);
    }
    if (!probed && waited >= 0.5 * timeout_seconds) {
      probed = true;
      members = label.group != MPI_COMM_NULL ? world_ranks_of(label.group) : std::vector<int>{};
      send_probes(liveness, members, my_rank);
    }
    if (probed) collect_answers(liveness, answers);
    if (waited >= timeout_seconds && (!silent_members(members, my_rank, answers).empty() ||
                                      waited >= (1 + kGraceWhenAllAnswered) * timeout_seconds))
      report_and_abort(label, members, answers);
    sched_yield();  // ranks may outnumber cores
  }
}

}  // namespace retort::parallel
