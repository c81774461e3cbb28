// parallel/host_staged_backend.cpp: see host_staged_backend.h.
#include "parallel/host_staged_backend.h"

namespace retort::parallel {
namespace {

// An uninitialised host tensor of t's shape and type; pinned when t is on a GPU, so the
// copies in and out are DMA transfers.
torch::Tensor host_like(const torch::Tensor& t) {
  return torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(t.is_cuda()));
}

// A host copy of t (a CUDA source: after the work queued on its stream).
torch::Tensor host_copy(const torch::Tensor& t) {
  torch::Tensor host = host_like(t);
  host.copy_(t);
  return host;
}

// `handle` (an operation writing `host`), then `host` copied into `target`. The MPI handle
// keeps its own buffers alive until then.
Handle copied_back(Handle handle, const torch::Tensor& target, const torch::Tensor& host) {
  torch::Tensor out = target;
  return std::move(handle).then([out, host]() mutable { out.copy_(host); });
}

}  // namespace

Handle HostStagedBackend::all_reduce(torch::Tensor& buffer, ReduceOp op) {
  torch::Tensor host = host_copy(buffer);
  return copied_back(mpi_.all_reduce(host, op), buffer, host);
}

Handle HostStagedBackend::all_gather(const torch::Tensor& in, torch::Tensor& out) {
  torch::Tensor host_in = host_copy(in), host_out = host_like(out);
  return copied_back(mpi_.all_gather(host_in, host_out), out, host_out);
}

Handle HostStagedBackend::reduce_scatter(const torch::Tensor& in, torch::Tensor& out, ReduceOp op) {
  torch::Tensor host_in = host_copy(in), host_out = host_like(out);
  return copied_back(mpi_.reduce_scatter(host_in, host_out, op), out, host_out);
}

Handle HostStagedBackend::reduce_scatter_v(const torch::Tensor& in, torch::Tensor& out,
                                           const std::vector<int64_t>& counts, ReduceOp op) {
  torch::Tensor host_in = host_copy(in), host_out = host_like(out);
  return copied_back(mpi_.reduce_scatter_v(host_in, host_out, counts, op), out, host_out);
}

Handle HostStagedBackend::all_gather_v(const torch::Tensor& in, torch::Tensor& out,
                                       const std::vector<int64_t>& counts) {
  torch::Tensor host_in = host_copy(in), host_out = host_like(out);
  return copied_back(mpi_.all_gather_v(host_in, host_out, counts), out, host_out);
}

Handle HostStagedBackend::broadcast(torch::Tensor& tensor, int root) {
  // The root sends its tensor; the others receive into theirs.
  if (rank_ == root) {
    torch::Tensor host = host_copy(tensor);
    return mpi_.broadcast(host, root);  // the MPI handle keeps its buffer alive
  }
  torch::Tensor host = host_like(tensor);
  return copied_back(mpi_.broadcast(host, root), tensor, host);
}

Handle HostStagedBackend::send(const torch::Tensor& tensor, int destination, int tag) {
  torch::Tensor host = host_copy(tensor);
  return mpi_.send(host, destination, tag);  // the MPI handle keeps its buffer alive
}

Handle HostStagedBackend::recv(torch::Tensor& tensor, int source, int tag) {
  torch::Tensor host = host_like(tensor);
  return copied_back(mpi_.recv(host, source, tag), tensor, host);
}

}  // namespace retort::parallel
