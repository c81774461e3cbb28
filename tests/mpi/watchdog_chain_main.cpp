// tests/mpi/watchdog_chain_main.cpp: a stall that reaches a rank through another group, for
// tests/cli/watchdog_names_the_frozen_rank.sh. Three ranks, timeout T seconds (argv[1]):
// rank 2 stops answering (it sleeps outside MPI, as a frozen process would); rank 0 computes
// for 0.3 T, then waits on rank 2 in group {0, 2}; rank 1 waits on rank 0 in group {0, 1}
// from the start. Rank 1's whole group answers, so its timeout must not end the job before
// rank 0's names rank 2.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/collective_watchdog.h"

namespace {

// Waits, under the watchdog, for one int from `source` of `group`.
void wait_for_message(MPI_Comm group, int source, const std::string& name) {
  int value = 0;
  std::vector<MPI_Request> requests(1);
  MPI_Irecv(&value, 1, MPI_INT, source, 0, group, &requests[0]);
  retort::parallel::WaitLabel label;
  label.op = "recv";
  label.group_name = &name;
  label.group = group;
  retort::parallel::wait_or_abort(requests, label);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 3 || argc != 2) {
    std::fprintf(stderr, "usage: mpirun -np 3 watchdog_chain TIMEOUT_S\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const double timeout_s = std::atof(argv[1]);
  retort::parallel::init_collective_watchdog();
  retort::parallel::set_collective_timeout(timeout_s);
  MPI_Comm with_rank_2, with_rank_1;  // {0, 2} and {0, 1}; the others get their own group
  MPI_Comm_split(MPI_COMM_WORLD, rank == 1 ? MPI_UNDEFINED : 0, rank, &with_rank_2);
  MPI_Comm_split(MPI_COMM_WORLD, rank == 2 ? MPI_UNDEFINED : 0, rank, &with_rank_1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 2) {
    sleep(unsigned(4 * timeout_s));  // frozen: never answers a probe
  } else if (rank == 0) {
    usleep(useconds_t(0.3 * timeout_s * 1e6));  // still computing while rank 1 waits
    wait_for_message(with_rank_2, /*source=*/1, "with rank 2");
  } else {
    wait_for_message(with_rank_1, /*source=*/0, "with rank 1");
  }
  std::fprintf(stderr, "rank %d: the wait ended without the watchdog\n", rank);
  MPI_Finalize();
  return 1;
}
