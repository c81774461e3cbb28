// tests/mpi/mpi_main.cpp: GoogleTest main for tests run under mpirun. Every rank runs every
// test; the process exits non-zero on every rank if any rank failed, and also when the
// filter selected no test at all (a misspelt --gtest_filter must not pass). Rank 0 prints.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
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
