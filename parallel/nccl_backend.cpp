// parallel/nccl_backend.cpp: see nccl_backend.h.
#include "parallel/nccl_backend.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "parallel/collective_watchdog.h"
#include "parallel/device_watchdog.h"

namespace retort::parallel {
namespace {

void check(ncclResult_t result, const std::string& what) {
  if (result != ncclSuccess)
    throw std::runtime_error("NCCL " + what + ": " + ncclGetErrorString(result));
}

void check(cudaError_t result, const std::string& what) {
  if (result != cudaSuccess)
    throw std::runtime_error("CUDA " + what + ": " + cudaGetErrorString(result));
}

ncclDataType_t nccl_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return ncclFloat32;
    case torch::kDouble:
      return ncclFloat64;
    case torch::kLong:
      return ncclInt64;
    case torch::kInt:
      return ncclInt32;
    case torch::kByte:
      return ncclUint8;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kHalf:
      return ncclFloat16;
    default:
      throw std::invalid_argument(std::string("NCCL: unsupported dtype ") +
                                  c10::toString(t.scalar_type()));
  }
}

ncclComm_t comm_of(void* comm) {
  return static_cast<ncclComm_t>(comm);
}
cudaStream_t stream_of(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

void* element(const torch::Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + offset * t.element_size();
}

}  // namespace

NcclWork::NcclWork(std::shared_ptr<NcclBackend> backend, std::vector<torch::Tensor> tensors,
                   std::string op)
    : backend_(std::move(backend)), tensors_(std::move(tensors)), op_(std::move(op)) {}

NcclWork::~NcclWork() = default;

bool NcclWork::ready() {
  if (!event_) backend_->flush();  // queued point-to-point work
  if (!event_) return false;
  const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event_.get()));
  if (state == cudaSuccess) return true;
  // An error is not "not ready": waiting on would last until the watchdog's timeout.
  if (state != cudaErrorNotReady)
    backend_->fail(op_, std::string("CUDA: ") + cudaGetErrorString(state));
  const std::string async = backend_->async_error();
  if (!async.empty()) backend_->fail(op_, async);
  return false;
}

void NcclWork::wait() {
  if (!event_) backend_->flush();
  c10::cuda::CUDAGuard guard(backend_->device_);
  check(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream().stream(),
                            static_cast<cudaEvent_t>(event_.get()), 0),
        "stream wait");
  // The allocator keeps the tensors' memory until the backend stream passes this operation
  // (recordStream in run()), so they need not be held here.
  tensors_.clear();
}

NcclBackend::NcclBackend(MPI_Comm group, int device, std::string name)
    : device_(device), name_(std::move(name)) {
  int rank = 0, size = 1;
  MPI_Comm_rank(group, &rank);
  MPI_Comm_size(group, &size);
  check(cudaSetDevice(device_), "set device " + std::to_string(device_));
  ncclUniqueId id;
  if (rank == 0) check(ncclGetUniqueId(&id), "get unique id");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, group);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream create");
  stream_ = stream;
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, size, id, rank), "init rank on group '" + name_ + "'");
  comm_ = comm;
  DeviceWatchdog::Group watched;
  watched.name = name_;
  watched.world_ranks = world_ranks_of(group);
  watched.async_error = [this] { return async_error(); };
  watched.abort = [this] { abort(); };
  watchdog_group_ = DeviceWatchdog::process().add_group(std::move(watched));
}

NcclBackend::~NcclBackend() {
  DeviceWatchdog::process().remove_group(watchdog_group_);  // before the communicator goes
  if (comm_) ncclCommDestroy(comm_of(comm_));
  if (stream_) cudaStreamDestroy(stream_of(stream_));
}

void NcclBackend::fail(const std::string& op, const std::string& reason) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr,
               "retort: rank %d: %s on group '%s' failed on GPU %d (%s); aborting the group's "
               "NCCL communicator and ending the job.\n",
               world_rank, op.c_str(), name_.c_str(), device_, reason.c_str());
  std::fflush(stderr);
  abort();
  MPI_Abort(MPI_COMM_WORLD, 4);
  std::abort();  // MPI_Abort does not return
}

void NcclBackend::abort() {
  std::lock_guard<std::mutex> lock(comm_mutex_);
  if (comm_) ncclCommAbort(comm_of(comm_));
  comm_ = nullptr;
}

std::string NcclBackend::async_error() {
  std::lock_guard<std::mutex> lock(comm_mutex_);
  ncclResult_t async = ncclSuccess;
  if (!comm_ || ncclCommGetAsyncError(comm_of(comm_), &async) != ncclSuccess) return "";
  if (async == ncclSuccess || async == ncclInProgress) return "";
  return std::string("NCCL: ") + ncclGetErrorString(async);
}

void NcclBackend::record_after(NcclWork& work) {
  cudaEvent_t raw = nullptr;
  check(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming), "event create");
  std::shared_ptr<void> event(raw, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  check(cudaEventRecord(raw, stream_of(stream_)), "event record");
  work.event_ = event;
  DeviceWatchdog::process().track(watchdog_group_, work.op_, [event] {
    const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event.get()));
    if (state == cudaSuccess) return DeviceOpPoll{DeviceOpState::done, ""};
    if (state == cudaErrorNotReady) return DeviceOpPoll{DeviceOpState::pending, ""};
    return DeviceOpPoll{DeviceOpState::failed, std::string("CUDA: ") + cudaGetErrorString(state)};
  });
}

template <typename Issue>
std::shared_ptr<NcclWork> NcclBackend::run(std::vector<torch::Tensor> tensors, const char* op,
                                           Issue issue) {
  if (!comm_) throw std::runtime_error("NCCL group '" + name_ + "' was aborted");
  flush();  // queued sends and receives go first, in the order they were asked for
  c10::cuda::CUDAGuard guard(device_);
  cudaEvent_t before = nullptr;
  check(cudaEventCreateWithFlags(&before, cudaEventDisableTiming), "event create");
  check(cudaEventRecord(before, c10::cuda::getCurrentCUDAStream().stream()), "event record");
  check(cudaStreamWaitEvent(stream_of(stream_), before, 0), "stream wait");
  cudaEventDestroy(before);
  const c10::cuda::CUDAStream backend_stream =
      c10::cuda::getStreamFromExternal(stream_of(stream_), device_);
  for (const torch::Tensor& t : tensors)
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), backend_stream);
  issue(comm_of(comm_), stream_of(stream_));
  auto work = std::make_shared<NcclWork>(shared_from_this(), std::move(tensors), op);
  record_after(*work);
  return work;
}

std::shared_ptr<NcclWork> NcclBackend::all_reduce(const torch::Tensor& t, NcclOp op) {
  return run({t}, "all_reduce", [&](ncclComm_t comm, cudaStream_t stream) {
    check(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t),
                        op == NcclOp::Sum ? ncclSum : ncclMax, comm, stream),
          "all_reduce");
  });
}

std::shared_ptr<NcclWork> NcclBackend::all_gather(const torch::Tensor& in,
                                                  const torch::Tensor& out) {
  return run({in, out}, "all_gather", [&](ncclComm_t comm, cudaStream_t stream) {
    check(ncclAllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), nccl_type(in), comm,
                        stream),
          "all_gather");
  });
}

std::shared_ptr<NcclWork> NcclBackend::reduce_scatter(const torch::Tensor& in,
                                                      const torch::Tensor& out) {
  return run({in, out}, "reduce_scatter", [&](ncclComm_t comm, cudaStream_t stream) {
    check(ncclReduceScatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()), nccl_type(in),
                            ncclSum, comm, stream),
          "reduce_scatter");
  });
}

std::shared_ptr<NcclWork> NcclBackend::reduce_scatter_v(const torch::Tensor& in,
                                                        const torch::Tensor& out,
                                                        const std::vector<int64_t>& counts) {
  return run({in, out}, "reduce_scatter_v", [&](ncclComm_t comm, cudaStream_t stream) {
    int rank = 0;
    check(ncclCommUserRank(comm, &rank), "user rank");
    check(ncclGroupStart(), "group start");
    int64_t offset = 0;
    for (size_t root = 0; root < counts.size(); ++root) {
      check(ncclReduce(element(in, offset), int(root) == rank ? out.data_ptr() : nullptr,
                       size_t(counts[root]), nccl_type(in), ncclSum, int(root), comm, stream),
            "reduce");
      offset += counts[root];
    }
    check(ncclGroupEnd(), "group end");
  });
}

std::shared_ptr<NcclWork> NcclBackend::all_gather_v(const torch::Tensor& in,
                                                    const torch::Tensor& out,
                                                    const std::vector<int64_t>& counts) {
  return run({in, out}, "all_gather_v", [&](ncclComm_t comm, cudaStream_t stream) {
    int rank = 0;
    check(ncclCommUserRank(comm, &rank), "user rank");
    check(ncclGroupStart(), "group start");
    int64_t offset = 0;
    for (size_t root = 0; root < counts.size(); ++root) {
      // The owner sends its own part from `in`; everyone receives it in place in `out`.
      check(ncclBroadcast(int(root) == rank ? in.data_ptr() : element(out, offset),
                          element(out, offset), size_t(counts[root]), nccl_type(out), int(root),
                          comm, stream),
            "broadcast");
      offset += counts[root];
    }
    check(ncclGroupEnd(), "group end");
  });
}

std::shared_ptr<NcclWork> NcclBackend::broadcast(const torch::Tensor& t, int root) {
  return run({t}, "broadcast", [&](ncclComm_t comm, cudaStream_t stream) {
    check(ncclBroadcast(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t), root, comm,
                        stream),
          "broadcast");
  });
}

std::shared_ptr<NcclWork> NcclBackend::send(const torch::Tensor& t, int peer) {
  auto work = std::make_shared<NcclWork>(shared_from_this(), std::vector<torch::Tensor>{t}, "send");
  queued_.push_back({t, peer, true, work});
  return work;
}

std::shared_ptr<NcclWork> NcclBackend::recv(const torch::Tensor& t, int peer) {
  auto work = std::make_shared<NcclWork>(shared_from_this(), std::vector<torch::Tensor>{t}, "recv");
  queued_.push_back({t, peer, false, work});
  return work;
}

void NcclBackend::flush() {
  if (queued_.empty()) return;
  std::vector<PointToPoint> batch;
  batch.swap(queued_);
  std::vector<torch::Tensor> tensors;
  for (const PointToPoint& p : batch) tensors.push_back(p.tensor);
  run(tensors, "send/recv", [&](ncclComm_t comm, cudaStream_t stream) {
    check(ncclGroupStart(), "group start");
    for (const PointToPoint& p : batch) {
      if (p.send)
        check(ncclSend(p.tensor.data_ptr(), size_t(p.tensor.numel()), nccl_type(p.tensor), p.peer,
                       comm, stream),
              "send");
      else
        check(ncclRecv(p.tensor.data_ptr(), size_t(p.tensor.numel()), nccl_type(p.tensor), p.peer,
                       comm, stream),
              "recv");
    }
    check(ncclGroupEnd(), "group end");
  });
  // Every queued work completes with the group: each gets its own event after it.
  c10::cuda::CUDAGuard guard(device_);
  for (const PointToPoint& p : batch) record_after(*p.work);
}

}  // namespace retort::parallel
