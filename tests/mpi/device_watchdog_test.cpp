// tests/mpi/device_watchdog_test.cpp: the device watchdog's logic (parallel/device_watchdog.h)
// on the CPU, three ranks, its own main (the watchdog's thread uses MPI, so MPI_THREAD_MULTIPLE).
// Groups and operations are the watchdog's real interface, given functions that stand for
// ncclCommGetAsyncError, cudaEventQuery and ncclCommAbort: an injected asynchronous error, a
// failed operation, a silent rank (one that runs no watchdog, as a frozen process answers
// nothing), a deadlock of the whole group, and operations that complete in time.
#include "parallel/device_watchdog.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/collective_watchdog.h"

namespace retort::parallel {
namespace {

using Clock = std::chrono::steady_clock;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// What a watchdog reported, and the communicators it aborted.
struct Outcome {
  std::mutex mutex;
  std::string report;
  int reports = 0;
  std::atomic<int> aborted_tp{0}, aborted_dp{0};
  Clock::time_point start = Clock::now(), ended;
};

// A watchdog on its own duplicate of MPI_COMM_WORLD; `end_job` records instead of ending.
struct Watched {
  MPI_Comm liveness = MPI_COMM_NULL;
  std::unique_ptr<DeviceWatchdog> watchdog;
  int tp = -1, dp = -1;

  Watched(Outcome& outcome, double timeout, std::function<std::string()> tp_async_error) {
    MPI_Comm_dup(MPI_COMM_WORLD, &liveness);
    watchdog = std::make_unique<DeviceWatchdog>(
        liveness, [timeout] { return timeout; },
        [&outcome](const std::string& report) {
          std::lock_guard<std::mutex> lock(outcome.mutex);
          outcome.report = report;
          ++outcome.reports;
          outcome.ended = Clock::now();
        });
    tp = watchdog->add_group(
        {"tp", {0, 1, 2}, std::move(tp_async_error), [&outcome] { ++outcome.aborted_tp; }});
    dp = watchdog->add_group(
        {"dp", {world_rank()}, [] { return std::string(); }, [&outcome] { ++outcome.aborted_dp; }});
  }
  ~Watched() {
    watchdog.reset();
    MPI_Comm_free(&liveness);
  }
  bool wait_until_ended(double seconds) const {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (!watchdog->ended() && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return watchdog->ended();
  }
};

DeviceOpPoll pending() {
  return {DeviceOpState::pending, ""};
}

TEST(DeviceWatchdog, InjectedAsyncErrorEndsWithOneLineAndAbortsEveryCommunicator) {
  const int rank = world_rank();
  std::atomic<bool> inject{false};
  Outcome outcome;
  {
    Watched watched(outcome, /*timeout=*/0, [&inject] {
      return inject ? std::string("NCCL: unhandled system error (injected)") : std::string();
    });
    watched.watchdog->track(watched.tp, "all_reduce", pending);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(watched.watchdog->ended()) << "no error yet";
    if (rank == 1) inject = true;
    if (rank == 1) {
      EXPECT_TRUE(watched.wait_until_ended(5.0)) << "the injected error was not seen";
      std::lock_guard<std::mutex> lock(outcome.mutex);
      EXPECT_EQ(outcome.reports, 1);
      EXPECT_EQ(outcome.report.find('\n'), std::string::npos) << outcome.report;
      EXPECT_NE(outcome.report.find("rank 1: all_reduce on group 'tp' (world ranks 0,1,2) failed: "
                                    "NCCL: unhandled system error (injected)"),
                std::string::npos)
          << outcome.report;
      EXPECT_NE(outcome.report.find("aborted 2 NCCL communicator(s), ending the job"),
                std::string::npos)
          << outcome.report;
      EXPECT_EQ(outcome.aborted_tp.load(), 1);
      EXPECT_EQ(outcome.aborted_dp.load(), 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank != 1) {
      EXPECT_FALSE(watched.watchdog->ended()) << outcome.report;
      EXPECT_EQ(outcome.aborted_tp.load(), 0);
    }
  }
}

TEST(DeviceWatchdog, FailedOperationIsNamedWithItsGroup) {
  Outcome outcome;
  Watched watched(outcome, /*timeout=*/0, [] { return std::string(); });
  watched.watchdog->track(watched.dp, "reduce_scatter", [] {
    return DeviceOpPoll{DeviceOpState::done, ""};
  });
  watched.watchdog->track(watched.tp, "send/recv", [] {
    return DeviceOpPoll{DeviceOpState::failed, "CUDA: an illegal memory access was encountered"};
  });
  ASSERT_TRUE(watched.wait_until_ended(5.0));
  std::lock_guard<std::mutex> lock(outcome.mutex);
  EXPECT_NE(outcome.report.find("send/recv on group 'tp' (world ranks 0,1,2) failed: CUDA: an "
                                "illegal memory access was encountered"),
            std::string::npos)
      << outcome.report;
  EXPECT_EQ(outcome.aborted_tp.load(), 1);
  EXPECT_EQ(outcome.aborted_dp.load(), 1);
}

TEST(DeviceWatchdog, SilentRankIsNamedAtTheTimeout) {
  int provided = 0;
  MPI_Query_thread(&provided);
  ASSERT_EQ(provided, MPI_THREAD_MULTIPLE) << "liveness probes need MPI_THREAD_MULTIPLE";
  const int rank = world_rank();
  const double timeout = 1.0;
  Outcome outcome;
  if (rank == 2) {
    // A frozen process: its device waits, but no watchdog thread runs to answer.
    MPI_Comm liveness;
    MPI_Comm_dup(MPI_COMM_WORLD, &liveness);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_free(&liveness);
    return;
  }
  Watched watched(outcome, timeout, [] { return std::string(); });
  watched.watchdog->track(watched.tp, "all_reduce", pending);
  EXPECT_TRUE(watched.wait_until_ended(5 * timeout));
  {
    std::lock_guard<std::mutex> lock(outcome.mutex);
    const std::string& report = outcome.report;
    EXPECT_EQ(report.find('\n'), std::string::npos) << report;
    EXPECT_NE(report.find("rank " + std::to_string(rank) +
                          ": all_reduce on group 'tp' (world ranks 0,1,2) did not complete "
                          "within runtime.collective_timeout_s=1 s: no answer from rank(s) 2 on "),
              std::string::npos)
        << report;
    // The other live member answered with what it waits in.
    const int other = 1 - rank;
    EXPECT_NE(report.find("rank " + std::to_string(other) + " waits in all_reduce on group 'tp'"),
              std::string::npos)
        << report;
    EXPECT_GE(std::chrono::duration<double>(outcome.ended - outcome.start).count(), timeout);
    EXPECT_EQ(outcome.aborted_tp.load(), 1);
    EXPECT_EQ(outcome.aborted_dp.load(), 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // before the liveness communicator is freed, as rank 2's
}

TEST(DeviceWatchdog, WholeGroupStuckInItIsADeadlockOfTheOrder) {
  const double timeout = 0.6;
  Outcome outcome;
  Watched watched(outcome, timeout, [] { return std::string(); });
  watched.watchdog->track(watched.tp, "send/recv", pending);
  EXPECT_TRUE(watched.wait_until_ended(6 * timeout));
  {
    std::lock_guard<std::mutex> lock(outcome.mutex);
    EXPECT_NE(outcome.report.find("every member answered and waits in this group"),
              std::string::npos)
        << outcome.report;
    // Every member answered, so each gave the others half a timeout more before reporting.
    EXPECT_GE(std::chrono::duration<double>(outcome.ended - outcome.start).count(), 1.5 * timeout);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(DeviceWatchdog, OperationsThatCompleteInTimeNeverReport) {
  const double timeout = 0.5;
  Outcome outcome;
  Watched watched(outcome, timeout, [] { return std::string(); });
  for (int i = 0; i < 3; ++i) {
    const auto done_at = Clock::now() + std::chrono::milliseconds(200);
    watched.watchdog->track(watched.tp, "all_gather", [done_at] {
      return DeviceOpPoll{Clock::now() >= done_at ? DeviceOpState::done : DeviceOpState::pending,
                          ""};
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_FALSE(watched.watchdog->ended()) << outcome.report;
  EXPECT_EQ(outcome.aborted_tp.load(), 0);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace retort::parallel

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  retort::parallel::init_collective_watchdog();  // the host names the reports use
  ::testing::InitGoogleTest(&argc, argv);
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
