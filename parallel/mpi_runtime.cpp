// parallel/mpi_runtime.cpp: see mpi_runtime.h.
#include "parallel/mpi_runtime.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "parallel/collective_watchdog.h"

namespace retort::parallel {

void set_mpi_defaults() {
  setenv("OMPI_MCA_btl_tcp_progress_thread", "1", /*overwrite=*/0);
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    set_mpi_defaults();
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    owns_mpi_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  MPI_Get_processor_name(name, &length);
  host_.assign(name, length);
  init_collective_watchdog();
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

int MpiRuntime::threads_per_rank() const {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, local_size_));
}

void MpiRuntime::abort_all(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
    MPI_Finalize();
  }
  std::exit(code);
}

}  // namespace retort::parallel
