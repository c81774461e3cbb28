// bench/bench_allreduce.cpp: the DP gradient sum's two ways on the ranks mpirun starts (all on
// this node), per message size: an MPI_Iallreduce in place (what Communicator::all_reduce_async
// posts) and the shared-memory sum (parallel/shared_reduction.h: copy in, sum, copy out).
// Rank 0 prints GB/s of message bytes, the best of `repeats`. Given `elements`, only that size
// (bench/slow_link.sh: a model's whole gradient).
// Usage: mpirun -np 2 bench_allreduce [repeats=5] [elements]
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_args.h"
#include "bench_mpi_main.h"
#include "parallel/communicator.h"
#include "parallel/shared_reduction.h"

using namespace retort;

namespace {

template <typename F>
double best_seconds(int repeats, F f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    f();
    double took = MPI_Wtime() - start, slowest = 0;
    MPI_Allreduce(&took, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    best = std::min(best, slowest);
  }
  return best;
}

int run(int argc, char** argv, parallel::MpiRuntime& mpi) {
  const int repeats = int(bench::count_argument(argc, argv, 1, "repeats", 5));
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  parallel::Communicator comm(dup, "bench");
  if (mpi.world_rank() == 0) {
    std::printf("%d ranks; GB/s of message bytes (best of %d), fp32\n", comm.size(), repeats);
    std::printf("| message | MPI_Iallreduce | shared memory |\n|---|---|---|\n");
  }
  std::vector<int64_t> sizes = {int64_t(1) << 18, int64_t(1) << 20, int64_t(1) << 22,
                                int64_t(1) << 24};
  if (argc > 2) sizes = {bench::count_argument(argc, argv, 2, "elements", 0)};
  for (int64_t elements : sizes) {
    torch::Tensor data = torch::randn({elements});
    const double bytes = double(elements) * 4;
    const double mpi_s = best_seconds(repeats, [&] {
      MPI_Request r;
      MPI_Iallreduce(MPI_IN_PLACE, data.data_ptr(), int(elements), MPI_FLOAT, MPI_SUM, comm.mpi(),
                     &r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    });
    std::unique_ptr<parallel::SharedReduction> shared =
        parallel::SharedReduction::create(comm, {{elements, torch::kFloat}});
    double shared_s = 0;
    if (shared) {
      shared->start(0, {data});  // first touch of the segment's pages
      shared->finish(0, {data});
      shared_s = best_seconds(repeats, [&] {
        shared->start(0, {data});
        shared->finish(0, {data});
      });
    }
    if (mpi.world_rank() == 0) {
      char shared_cell[64] = "n/a (ranks on several nodes)";
      if (shared) std::snprintf(shared_cell, sizeof(shared_cell), "%.2f", bytes / shared_s / 1e9);
      std::printf("| %.1f MB | %.2f | %s |\n", bytes / 1e6, bytes / mpi_s / 1e9, shared_cell);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::mpi_main_reporting_errors(run, argc, argv);
}
