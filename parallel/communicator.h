// parallel/communicator.h: collective and point-to-point communication on torch tensors
// within one process group (docs/architecture.md): all_reduce, all_gather, reduce_scatter,
// broadcast, send, recv, barrier, each with an async form returning a handle, and per-operation
// counters of calls and bytes. This is the MPI backend (CPU tensors); layers never call MPI
// themselves. CUDA tensors go through NCCL when built with -DRETORT_NCCL=ON (nccl_backend.h);
// otherwise they are refused with a clear error. Under Transport::host_staged every tensor
// travels through host copies over MPI instead. Byte counts: all_reduce and broadcast count the
// tensor, all_gather the gathered result, reduce_scatter the full input, send/recv the message.
// 16-bit floats (bfloat16, float16): moved as they are; ReduceOp::Sum reduces them (all_reduce,
// reduce_scatter) in float32 and rounds once, so a sum does not depend on how many ranks or
// steps it took, and counts and moves the float32 bytes; ReduceOp::SumNarrow moves and sums
// them in their own type (the tensor-parallel activation sums, parallel/primitives.cpp).
#pragma once
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/collective_watchdog.h"
#include "parallel/transport.h"

namespace retort::parallel {

// Sum and Max reduce 16-bit floats in float32 (widened before, rounded once after: MPI has no
// bfloat16 type, and rounding at every step of a ring or tree would make the sum depend on the
// number of ranks). SumNarrow moves and sums them in their own type: half the bytes, each
// partial sum rounded, as NCCL's bf16 sums do (the tensor-parallel activation sums, and the DP
// sums under parallel.dp_reduce_dtype=bfloat16); for other types it is Sum.
enum class ReduceOp { Sum, Max, SumNarrow };

// Seconds this process has spent blocked in communication since start (or the last reset):
// in Handle::wait (which every blocking collective, send and receive goes through), in
// broadcast and in barrier. Time an asynchronous operation overlaps with computation is not
// counted: this is the exposed part. Waits for a slower peer count too, as they should.
double exposed_communication_seconds();
void reset_exposed_communication_seconds();
// Adds the time from its construction to its destruction to the exposed communication time
// (for waits that are not on MPI requests: shared_reduction.h).
class ExposedWait {
 public:
  ExposedWait();
  ~ExposedWait();

 private:
  std::chrono::steady_clock::time_point start_;
};

struct OpCounter {
  int64_t calls = 0;
  int64_t bytes = 0;
};

// A pending non-blocking operation. wait() completes it (and runs its finishing step, e.g.
// copying a gathered buffer into place); destruction waits too.
class Handle {
 public:
  Handle() = default;
  Handle(MPI_Request request, std::function<void()> finish);
  // Several requests (a message split into pieces) completed together.
  Handle(std::vector<MPI_Request> requests, std::function<void()> finish);
  // Work on a device (NCCL): `ready` says without blocking whether it is done; `finish` waits
  // for it.
  Handle(std::function<bool()> ready, std::function<void()> finish);
  Handle(Handle&&) noexcept;
  Handle& operator=(Handle&&) noexcept;
  ~Handle();
  void wait();
  bool test();  // drives progress without blocking; true once complete (finish has then run)
  bool pending() const { return !requests_.empty() || static_cast<bool>(ready_); }
  // This handle with `after` run once its own finishing step has (a staged operation's copy
  // back); a handle with nothing pending runs it at once.
  Handle then(std::function<void()> after) &&;
  // What the wait is for, named if it times out (collective_watchdog.h).
  void set_label(const WaitLabel& label) { label_ = label; }

 private:
  std::vector<MPI_Request> requests_;
  std::function<bool()> ready_;
  std::function<void()> finish_;
  WaitLabel label_;
};

class NcclBackend;

// How point-to-point messages on CPU tensors behave (parallel.p2p_rules). mpi: MPI's own.
// nccl: NCCL's pairing rules, so a message order can be tried on the CPU before it runs on
// GPUs: sends and receives queue until the next wait on any of them (or the next collective
// on the group), then launch together as one group; a group completes before the next one
// launches (one stream); and a send completes only once its receive has been launched
// (MPI_Issend), whatever its size (NCCL buffers only small ones). An order NCCL would
// deadlock on then deadlocks here, and the collective watchdog names it at its timeout.
enum class PointToPointRules { mpi, nccl };

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
  void set_point_to_point_rules(PointToPointRules rules) { p2p_rules_ = rules; }

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
  static int64_t max_elements_per_call();
  static void set_max_elements_per_call(int64_t elements);

  const std::map<std::string, OpCounter>& counters() const { return counters_; }
  // Adds one call of `bytes` to operation op's counter (also for sums done on this group
  // outside this class: shared_reduction.h).
  void count(const std::string& op, int64_t bytes);
  void reset_counters() { counters_.clear(); }

 private:
  explicit Communicator(std::string name);  // see single()
  // `handle` labelled with the operation `op` on this group, for the watchdog's report.
  Handle labelled(Handle handle, const char* op) const;
  // Whether an operation on this group goes through host buffers (see Transport): on a
  // group of more than one under host_staged, except the host copies themselves.
  bool stages() const { return transport_ == Transport::host_staged && size_ > 1 && !staging_; }
  // op on host buffers of in's and out's shapes (one buffer when in and out are the same
  // tensor, as in place), in copied into its buffer first when copy_in, and out written from
  // its buffer once the operation completes when copy_back.
  Handle staged(const torch::Tensor& in, torch::Tensor& out, bool copy_in, bool copy_back,
                const std::function<Handle(torch::Tensor&, torch::Tensor&)>& op);
  // The rooted forms behind split block / variable collectives: rank r's part
  // [offsets[r], offsets[r] + counts[r]) of `data` reduced onto r from every rank's `in`, or
  // broadcast from r; piece by piece.
  void reduce_parts_to_owners(const torch::Tensor& in, torch::Tensor& out,
                              const std::vector<int64_t>& counts,
                              std::vector<MPI_Request>& requests, MPI_Op op = MPI_SUM);
  void broadcast_parts_from_owners(torch::Tensor& out, const std::vector<int64_t>& counts,
                                   std::vector<MPI_Request>& requests);
  // The NCCL backend for CUDA tensors, created on first use (collectively) on t's GPU; throws
  // in a build without NCCL.
  NcclBackend& nccl(const torch::Tensor& t);
  std::shared_ptr<NcclBackend> nccl_;
  // PointToPointRules::nccl: the queued messages, and their launch as one group (waited for).
  struct QueuedMessage {
    torch::Tensor tensor;
    int peer, tag;
    bool send;
  };
  Handle queue_message(const torch::Tensor& t, int peer, int tag, bool send);
  void launch_queued_messages();
  std::vector<QueuedMessage> queued_;
  PointToPointRules p2p_rules_ = PointToPointRules::mpi;

  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  Transport transport_ = Transport::direct;
  bool staging_ = false;  // inside staged(): the operation runs on host copies
  std::map<std::string, OpCounter> counters_;
};

}  // namespace retort::parallel
