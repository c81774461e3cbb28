// parallel/nccl_backend.h: the NCCL side of a Communicator, for CUDA tensors where each rank of
// the group has its own GPU (parallel/transport.h). The ncclUniqueId is made on the group's
// rank 0 and broadcast over the group's MPI communicator; the communicator is created on the
// rank's GPU (cudaSetDevice first).
// - Ordering: each operation runs on the backend's own stream, after an event recorded on the
//   caller's current stream, so it never reads a tensor a kernel queued before it is still
//   writing; its tensors are marked as used on the backend stream (recordStream), so the caching
//   allocator does not hand their memory out again before the operation is done.
// - Completion: an operation returns an NcclWork holding an event recorded after it and the
//   tensors it uses. wait() makes the caller's current stream wait for the event and returns:
//   the host never spins on NCCL. ready() polls the event (for overlap). Each operation is
//   also tracked by the process's device watchdog (device_watchdog.h), whose thread polls its
//   event and the communicator's asynchronous error: an error, or an operation older than
//   runtime.collective_timeout_s, ends the job with one line naming the operation, the group
//   and its ranks (the silent ones where it can tell), every NCCL communicator aborted.
// - Point-to-point: sends and receives are queued and issued together, inside one
//   ncclGroupStart/End, at the next flush (any wait, any collective): NCCL matches them by
//   order per peer, and a ring of sends issued before its receives would deadlock one at a time.
// - Variable-size collectives (ZeRO-1's): one ncclReduce or ncclBroadcast per owner, grouped.
// Built only where the top level found a CUDA libtorch and NCCL (RETORT_WITH_CUDA).
#pragma once
#include <mpi.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace retort::parallel {

enum class NcclOp { Sum, Max };

class NcclBackend;

// One enqueued NCCL operation (or group of them).
class NcclWork {
 public:
  NcclWork(std::shared_ptr<NcclBackend> backend, std::vector<torch::Tensor> tensors,
           std::string op);
  ~NcclWork();
  bool ready();  // flushes queued point-to-point work first
  void wait();   // see the header comment

 private:
  friend class NcclBackend;
  std::shared_ptr<NcclBackend> backend_;
  std::vector<torch::Tensor> tensors_;
  std::string op_;
  std::shared_ptr<void> event_;  // cudaEvent_t, recorded once the work is issued; shared with
                                 // the watchdog, which may poll it after the work is gone
};

class NcclBackend : public std::enable_shared_from_this<NcclBackend> {
 public:
  // Collective over `group`; `device` is this rank's GPU.
  NcclBackend(MPI_Comm group, int device, std::string name);
  ~NcclBackend();
  int device() const { return device_; }
  const std::string& name() const { return name_; }

  std::shared_ptr<NcclWork> all_reduce(const torch::Tensor& t, NcclOp op);
  std::shared_ptr<NcclWork> all_gather(const torch::Tensor& in, const torch::Tensor& out);
  std::shared_ptr<NcclWork> reduce_scatter(const torch::Tensor& in, const torch::Tensor& out);
  // Rank r's part (counts[r] elements, in rank order in `in` and `out`) reduced onto r / sent
  // from r to every rank.
  std::shared_ptr<NcclWork> reduce_scatter_v(const torch::Tensor& in, const torch::Tensor& out,
                                             const std::vector<int64_t>& counts);
  std::shared_ptr<NcclWork> all_gather_v(const torch::Tensor& in, const torch::Tensor& out,
                                         const std::vector<int64_t>& counts);
  std::shared_ptr<NcclWork> broadcast(const torch::Tensor& t, int root);
  // Queued until the next flush (see the header comment).
  std::shared_ptr<NcclWork> send(const torch::Tensor& t, int peer);
  std::shared_ptr<NcclWork> recv(const torch::Tensor& t, int peer);
  // Issues the queued sends and receives as one group.
  void flush();
  // ncclCommAbort, from any thread: what the watchdog does before ending the job.
  void abort();
  // ncclCommGetAsyncError as a reason ("" while healthy), from any thread.
  std::string async_error();
  // An operation found failed (a CUDA error on its event, or the communicator's asynchronous
  // NCCL error): one line naming the operation, the group and the reason, the communicator
  // aborted, the job ended.
  [[noreturn]] void fail(const std::string& op, const std::string& reason);

 private:
  friend class NcclWork;
  struct PointToPoint {
    torch::Tensor tensor;
    int peer;
    bool send;
    std::shared_ptr<NcclWork> work;
  };
  // Makes the backend stream wait for the caller's current stream and marks `tensors` as used
  // on the backend stream; then `issue` enqueues the NCCL calls, and an event is recorded on
  // `work` after them.
  template <typename Issue>
  std::shared_ptr<NcclWork> run(std::vector<torch::Tensor> tensors, const char* op, Issue issue);
  void record_after(NcclWork& work);

  int device_;
  std::string name_;
  int watchdog_group_ = -1;  // this communicator's id in the device watchdog
  std::mutex comm_mutex_;    // abort and the asynchronous error come from the watchdog's thread
  void* comm_ = nullptr;     // ncclComm_t
  void* stream_ = nullptr;   // cudaStream_t
  std::vector<PointToPoint> queued_;
};

}  // namespace retort::parallel
