// parallel/mpi_backend.h: the Backend of CPU tensors: nonblocking MPI on the group's
// communicator. MPI takes int counts, so a message of more elements than
// max_elements_per_call() goes out in pieces (block and variable collectives then run as one
// rooted reduce or broadcast per rank). 16-bit floats travel as their bits; a SumNarrow of them
// is a user-defined MPI operation adding in their own type. Point-to-point messages follow
// MPI's rules, or NCCL's (PointToPointRules::nccl, below). Every handle is labelled with its
// operation and group for the collective watchdog.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "parallel/backend.h"

namespace retort::parallel {

// How point-to-point messages on CPU tensors behave (parallel.p2p_rules). mpi: MPI's own.
// nccl: NCCL's pairing rules, so a message order can be tried on the CPU before it runs on
// GPUs: sends and receives queue until the next wait on any of them (or the next collective
// on the group), then launch together as one group; a group completes before the next one
// launches (one stream); and a send completes only once its receive has been launched
// (MPI_Issend), whatever its size (NCCL buffers only small ones). An order NCCL would
// deadlock on then deadlocks here, and the collective watchdog names it at its timeout.
enum class PointToPointRules { mpi, nccl };

class MpiBackend : public Backend {
 public:
  // `name` (the group's) must outlive the backend; comm is not owned.
  MpiBackend(MPI_Comm comm, int rank, int size, const std::string& name);

  Handle all_reduce(torch::Tensor& buffer, ReduceOp op) override;
  Handle all_gather(const torch::Tensor& in, torch::Tensor& out) override;
  Handle reduce_scatter(const torch::Tensor& in, torch::Tensor& out, ReduceOp op) override;
  Handle reduce_scatter_v(const torch::Tensor& in, torch::Tensor& out,
                          const std::vector<int64_t>& counts, ReduceOp op) override;
  Handle all_gather_v(const torch::Tensor& in, torch::Tensor& out,
                      const std::vector<int64_t>& counts) override;
  Handle broadcast(torch::Tensor& tensor, int root) override;
  Handle send(const torch::Tensor& tensor, int destination, int tag) override;
  Handle recv(torch::Tensor& tensor, int source, int tag) override;
  Handle barrier();

  void set_point_to_point_rules(PointToPointRules rules) { p2p_rules_ = rules; }
  // Under PointToPointRules::nccl: launches the queued messages as one group and waits for
  // them (every collective on the group does this first: they come before it on the stream).
  void launch_queued_messages();

  // INT_MAX by default; tests set a small limit to exercise the split.
  static int64_t max_elements_per_call();
  static void set_max_elements_per_call(int64_t elements);

 private:
  Handle labelled(Handle handle, const char* op) const;
  // The rooted forms behind split block / variable collectives: rank r's part
  // [offsets[r], offsets[r] + counts[r]) of `data` reduced onto r from every rank's `in`, or
  // broadcast from r; piece by piece.
  void reduce_parts_to_owners(const torch::Tensor& in, torch::Tensor& out,
                              const std::vector<int64_t>& counts,
                              std::vector<MPI_Request>& requests, MPI_Op op);
  void broadcast_parts_from_owners(torch::Tensor& out, const std::vector<int64_t>& counts,
                                   std::vector<MPI_Request>& requests);
  struct QueuedMessage {
    torch::Tensor tensor;
    int peer, tag;
    bool send;
  };
  Handle queue_message(const torch::Tensor& t, int peer, int tag, bool send);

  MPI_Comm comm_;
  int rank_, size_;
  const std::string& name_;
  PointToPointRules p2p_rules_ = PointToPointRules::mpi;
  std::vector<QueuedMessage> queued_;
};

}  // namespace retort::parallel
