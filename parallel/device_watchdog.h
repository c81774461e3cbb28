// parallel/device_watchdog.h: one thread per process that watches the operations a device runs
// asynchronously (NCCL collectives and messages on CUDA streams), so that no host thread spins
// on them: a wait on such an operation only makes the caller's stream wait for it
// (nccl_backend.h). The thread polls every tracked operation and every group's asynchronous
// error:
// - an operation or a group found failed: one line naming the operation, the group, its world
//   ranks and the reason; every group's communicator aborted; the job ended.
// - an operation older than runtime.collective_timeout_s: the same line, naming the members
//   that did not answer a liveness probe. As for MPI waits (collective_watchdog.h), the probes go
//   out at half the timeout, every watchdog thread answers with the oldest operation it waits
//   for, and a wait whose whole group answered gives the others half a timeout more, so that
//   the rank waiting on the silent one is the one to report. Probes need
//   MPI_THREAD_MULTIPLE; without it the line names the group's members only.
// No torch, no CUDA: groups and operations are given as functions, so the logic runs and is
// tested on the CPU (tests/mpi/device_watchdog_test.cpp).
#pragma once
#include <mpi.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace retort::parallel {

enum class DeviceOpState { pending, done, failed };
struct DeviceOpPoll {
  DeviceOpState state = DeviceOpState::pending;
  std::string reason;  // for failed
};

class DeviceWatchdog {
 public:
  struct Group {
    std::string name;
    std::vector<int> world_ranks;
    std::function<std::string()> async_error;  // "" while the communicator is healthy
    std::function<void()> abort;               // ncclCommAbort
  };
  // `liveness`: a communicator over MPI_COMM_WORLD that only watchdogs use for probes and
  // answers. `timeout_seconds` is read on every poll (0: no timeout, errors still end the job).
  // `end_job` gets the report once, on the watchdog's thread, after the aborts; the process's
  // watchdog prints it and calls MPI_Abort (a test's returns, and the watchdog stops).
  DeviceWatchdog(MPI_Comm liveness, std::function<double()> timeout_seconds,
                 std::function<void(const std::string&)> end_job);
  ~DeviceWatchdog();  // stops the thread; pending operations are dropped
  DeviceWatchdog(const DeviceWatchdog&) = delete;
  DeviceWatchdog& operator=(const DeviceWatchdog&) = delete;

  int add_group(Group group);
  // The group's pending operations are dropped with it.
  void remove_group(int group_id);
  // Polled until it reports done (dropped) or failed (the job ends).
  void track(int group_id, std::string op, std::function<DeviceOpPoll()> poll);
  // Whether end_job was called.
  bool ended() const { return ended_.load(); }

  // The process's watchdog (started on first use; liveness from init_collective_watchdog).
  static DeviceWatchdog& process();

 private:
  struct TrackedOp;
  struct State;
  void run();

  std::unique_ptr<State> state_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> ended_{false};
  std::thread thread_;
};

}  // namespace retort::parallel
