// parallel/mpi_runtime.h: process-wide MPI start-up and shutdown, world and node-local
// rank numbers, and the intra-op thread count each rank should use (cores / ranks on node).
// Knows nothing of torch: callers apply the thread count themselves.
#pragma once
#include <string>

namespace retort::parallel {

// Retort's OpenMPI settings, as environment defaults (a setting given outside wins); call
// before MPI_Init. MpiRuntime does; so does any other main that initialises MPI.
//  - The TCP transport between hosts moves bytes from a thread of its own, so a gradient
//    bucket's all-reduce travels while backward computes, not only inside MPI calls.
//  - Non-blocking all-reduces use Rabenseifner's algorithm (reduce-scatter, then all-gather)
//    at every size: libnbc otherwise reduces then broadcasts below 4 ranks, which sends
//    each message twice, as DP over two hosts does.
// bench/slow_link.sh measures what both do for the overlap across a slow link.
void set_mpi_defaults();

class MpiRuntime {
 public:
  // Initialises MPI if nobody has yet; finalizes at destruction only if it initialised.
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }  // rank among processes on this host
  int local_size() const { return local_size_; }  // processes on this host
  std::string host() const { return host_; }

  // Threads per rank: hardware cores on the host divided among its ranks, at least 1.
  int threads_per_rank() const;

  // Ends every rank at once after a fatal error seen on one rank.
  [[noreturn]] static void abort_all(int code);
  // Ends the job for bad input found on this rank, printing "error: <message>" once where
  // the terminal sees it. The ranks that found it agree over a communicator of their own
  // (no other collective can match theirs): when every rank did, rank 0 prints the line and
  // all exit with 2, without MPI_Abort; when some did not within a grace period (they wait
  // elsewhere), each that did prints it, lets mpirun forward it, then aborts the job with 2.
  [[noreturn]] static void exit_on_user_error(const std::string& message);

 private:
  bool owns_mpi_ = false;
  int world_rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
};

}  // namespace retort::parallel
