// parallel/device_backend.cpp: see device_backend.h.
#include "parallel/device_backend.h"

#include "parallel/nccl_backend.h"

namespace retort::parallel {
namespace {

// A handle on NCCL work: test() polls it, wait() waits for it (collective_watchdog.h).
Handle nccl_handle(std::shared_ptr<NcclWork> work) {
  return Handle([work] { return work->ready(); }, [work] { work->wait(); });
}

}  // namespace

DeviceBackend::DeviceBackend(MPI_Comm comm, int device, const std::string& name)
    : nccl_(std::make_shared<NcclBackend>(comm, device, name)) {}
DeviceBackend::~DeviceBackend() = default;

int DeviceBackend::device() const {
  return nccl_->device();
}

Handle DeviceBackend::all_reduce(torch::Tensor& buffer, ReduceOp op) {
  return nccl_handle(nccl_->all_reduce(buffer, op == ReduceOp::Max ? NcclOp::Max : NcclOp::Sum));
}
Handle DeviceBackend::all_gather(const torch::Tensor& in, torch::Tensor& out) {
  return nccl_handle(nccl_->all_gather(in, out));
}
Handle DeviceBackend::reduce_scatter(const torch::Tensor& in, torch::Tensor& out, ReduceOp) {
  return nccl_handle(nccl_->reduce_scatter(in, out));
}
Handle DeviceBackend::reduce_scatter_v(const torch::Tensor& in, torch::Tensor& out,
                                       const std::vector<int64_t>& counts, ReduceOp) {
  return nccl_handle(nccl_->reduce_scatter_v(in, out, counts));
}
Handle DeviceBackend::all_gather_v(const torch::Tensor& in, torch::Tensor& out,
                                   const std::vector<int64_t>& counts) {
  return nccl_handle(nccl_->all_gather_v(in, out, counts));
}
Handle DeviceBackend::broadcast(torch::Tensor& tensor, int root) {
  return nccl_handle(nccl_->broadcast(tensor, root));
}
// NCCL matches sends and receives by order per peer, not by tag; queued, they go out grouped
// at the next wait (nccl_backend.h).
Handle DeviceBackend::send(const torch::Tensor& tensor, int destination, int) {
  return nccl_handle(nccl_->send(tensor, destination));
}
Handle DeviceBackend::recv(torch::Tensor& tensor, int source, int) {
  return nccl_handle(nccl_->recv(tensor, source));
}

}  // namespace retort::parallel
