// parallel/nccl_backend.h: the NCCL side of a Communicator, used for CUDA tensors. The
// ncclUniqueId is made on the group's rank 0 and broadcast over the group's MPI
// communicator. Operations run on the backend's own CUDA stream; their Handles synchronise
// that stream on wait(). Built only with -DRETORT_NCCL=ON (a CUDA libtorch and NCCL).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>

namespace retort::parallel {

enum class NcclType { Float32, Float64, Int64, Int32, UInt8, BFloat16 };
enum class NcclOp { Sum, Max };

class NcclBackend {
 public:
  explicit NcclBackend(MPI_Comm group);
  ~NcclBackend();
  // Each call enqueues on the backend stream and returns without waiting.
  void all_reduce(void* data, size_t count, NcclType type, NcclOp op);
  void all_gather(const void* in, void* out, size_t count_per_rank, NcclType type);
  void reduce_scatter(const void* in, void* out, size_t count_per_rank, NcclType type);
  void broadcast(void* data, size_t count, NcclType type, int root);
  void send(const void* data, size_t count, NcclType type, int peer);
  void recv(void* data, size_t count, NcclType type, int peer);
  void synchronize();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace retort::parallel
