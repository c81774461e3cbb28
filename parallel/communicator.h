// parallel/communicator.h: collective and point-to-point communication on torch tensors
// within one process group (docs/architecture.md): all_reduce, all_gather, reduce_scatter,
// broadcast, send, recv, barrier, each with an async form returning a handle, and per-operation
// counters of calls and bytes. Layers never call MPI or NCCL themselves. The group holds one
// Backend per way it moves tensors (parallel/backend.h): MPI for CPU tensors, NCCL for CUDA
// ones (created on first use; refused with a clear error in a build without NCCL), and, under
// Transport::host_staged, host copies over MPI for every tensor; each operation here is the
// checks, the counters and the widening of 16-bit sums, then one call on the tensor's backend.
// Byte counts: all_reduce and broadcast count the tensor, all_gather the gathered result,
// reduce_scatter the full input, send/recv the message. 16-bit floats (bfloat16, float16):
// moved as they are; ReduceOp::Sum reduces them (all_reduce, reduce_scatter) in float32 and
// rounds once, so a sum does not depend on how many ranks or steps it took, and counts and
// moves the float32 bytes; ReduceOp::SumNarrow moves and sums them in their own type (the
// tensor-parallel activation sums, parallel/primitives.cpp).
#pragma once
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/backend.h"
#include "parallel/handle.h"
#include "parallel/host_staged_backend.h"
#include "parallel/mpi_backend.h"
#include "parallel/transport.h"

namespace retort::parallel {

class DeviceBackend;

struct OpCounter {
  int64_t calls = 0;
  int64_t bytes = 0;
};

class Communicator {
 public:
  // Takes ownership of comm (freed at destruction unless it is MPI_COMM_WORLD/SELF).
  Communicator(MPI_Comm comm, std::string name);
  // A group of one process that needs no MPI at all: every collective is the identity (a
  // single process without mpirun gets these, so the engine never branches on "no MPI").
  static std::unique_ptr<Communicator> single(std::string name);
  // One such group shared by the process: what a layer outside any mesh (a test, a tool on one
  // process) takes as its TP group, so a group always exists.
  static Communicator& one_process();
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  MPI_Comm mpi() const { return comm_; }
  Transport transport() const { return transport_; }
  void set_transport(Transport transport) { transport_ = transport; }
  void set_point_to_point_rules(PointToPointRules rules) { mpi_.set_point_to_point_rules(rules); }

  // In place on a contiguous tensor.
  void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  Handle all_reduce_async(torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  // Concatenation of every rank's tensor along dim.
  torch::Tensor all_gather(const torch::Tensor& tensor, int64_t dim);
  // Sum over ranks, then this rank's 1/size slice along dim.
  torch::Tensor reduce_scatter(const torch::Tensor& tensor, int64_t dim,
                               ReduceOp op = ReduceOp::Sum);
  // Flat contiguous forms for buckets: out has size x in's elements / in has size x out's.
  Handle all_gather_flat_async(const torch::Tensor& in, torch::Tensor& out);
  Handle reduce_scatter_flat_async(const torch::Tensor& in, torch::Tensor& out,
                                   ReduceOp op = ReduceOp::Sum);
  // Variable-size forms (ZeRO): rank r receives / contributes counts[r] elements; `in` of
  // reduce_scatter_v and `out` of all_gather_v hold the ranks' parts in rank order.
  Handle reduce_scatter_v_async(const torch::Tensor& in, torch::Tensor& out,
                                const std::vector<int64_t>& counts, ReduceOp op = ReduceOp::Sum);
  Handle all_gather_v_async(const torch::Tensor& in, torch::Tensor& out,
                            const std::vector<int64_t>& counts);
  void broadcast(torch::Tensor& tensor, int root);
  void send(const torch::Tensor& tensor, int destination, int tag = 0);
  void recv(torch::Tensor& tensor, int source, int tag = 0);
  Handle send_async(const torch::Tensor& tensor, int destination, int tag = 0);
  Handle recv_async(torch::Tensor& tensor, int source, int tag = 0);
  void barrier();

  // MPI takes int counts: a message of more elements than this goes out in pieces of at
  // most this many (variable and block collectives then run as one rooted reduce or
  // broadcast per rank). INT_MAX by default; tests set a small limit to exercise the split.
  static int64_t max_elements_per_call() { return MpiBackend::max_elements_per_call(); }
  static void set_max_elements_per_call(int64_t elements) {
    MpiBackend::set_max_elements_per_call(elements);
  }

  const std::map<std::string, OpCounter>& counters() const { return counters_; }
  // Adds one call of `bytes` to operation op's counter (also for sums done on this group
  // outside this class: shared_reduction.h).
  void count(const std::string& op, int64_t bytes);
  void reset_counters() { counters_.clear(); }

 private:
  explicit Communicator(std::string name);  // see single()
  // The backend that moves t on this group of more than one rank: host-staged under
  // Transport::host_staged, else NCCL for a CUDA tensor (created on its GPU on first use,
  // collectively), else MPI.
  Backend& backend_for(const torch::Tensor& t);

  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  Transport transport_ = Transport::direct;
  MpiBackend mpi_;
  HostStagedBackend staged_;
  std::unique_ptr<DeviceBackend> device_;
  std::map<std::string, OpCounter> counters_;
};

}  // namespace retort::parallel
