// tests/mpi/mpi_main.cpp: GoogleTest main for tests run under mpirun. Every rank runs every
// test; the process exits non-zero on every rank if any rank failed, and also when the
// filter selected no test at all (a misspelt --gtest_filter must not pass). Rank 0 prints
// everything; the other ranks print only their failed assertions, marked with their rank.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <string>

#include "parallel/collective_watchdog.h"
#include "parallel/mpi_runtime.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // (UnitTest::current_test_info() would take the lock AddTestPartResult holds.)
  void OnTestStart(const ::testing::TestInfo& test) override {
    name_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, name_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
  std::string name_;
};

}  // namespace

int main(int argc, char** argv) {
  retort::parallel::set_mpi_defaults();  // as every program's MpiRuntime
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  retort::parallel::init_collective_watchdog();  // trainers set the timeout from their config
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any_failed = 0;
  if (::testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    if (rank == 0) std::fprintf(stderr, "no test matched the filter\n");
    failed = 1;
  }
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "rank %d had failures\n", rank);
  MPI_Finalize();
  return any_failed;
}
