// parallel/mpi_runtime.cpp: see mpi_runtime.h.
#include "parallel/mpi_runtime.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "parallel/collective_watchdog.h"

namespace retort::parallel {
namespace {

// The communicator the ranks that found bad input agree over; no other call uses it.
MPI_Comm error_agreement = MPI_COMM_NULL;

// Whether this process may drive a GPU: NVIDIA's device nodes exist and CUDA_VISIBLE_DEVICES
// does not hide them all. Such a process asks MPI for MPI_THREAD_MULTIPLE, which the device
// watchdog's thread needs for its liveness probes (device_watchdog.h); a CPU process keeps the
// cheaper MPI_THREAD_FUNNELED (no thread of ours calls MPI there).
bool may_use_a_gpu() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible && (std::string(visible).empty() || std::string(visible) == "-1")) return false;
  return access("/dev/nvidiactl", F_OK) == 0;
}

}  // namespace

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
    MPI_Init_thread(argc, argv, may_use_a_gpu() ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                    &provided);
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
  if (error_agreement == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &error_agreement);
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

void MpiRuntime::exit_on_user_error(const std::string& message) {
  int initialized = 0, finalized = 0, size = 1, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool mpi_up = initialized && !finalized;
  if (mpi_up) {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  if (!mpi_up || size == 1 || error_agreement == MPI_COMM_NULL) {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    if (mpi_up) MPI_Finalize();
    std::exit(2);
  }
  // Every rank that found the error joins; the count completes only if all did.
  int mine = 1, total = 0;
  MPI_Request request;
  MPI_Iallreduce(&mine, &total, 1, MPI_INT, MPI_SUM, error_agreement, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (done && total == size) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    MPI_Barrier(error_agreement);  // rank 0's line is out before any rank leaves
    MPI_Finalize();
    std::exit(2);
  }
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // mpirun forwards the line
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
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
