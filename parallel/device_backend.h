// parallel/device_backend.h: the Backend of CUDA tensors on a directly connected group: each
// call is one operation of the group's NcclBackend (nccl_backend.h), returned as a Handle that
// polls its event and, on wait, makes the caller's stream wait for it. The NCCL communicator is
// created (collectively) on the GPU of the first tensor; a tensor on another GPU is refused.
// In a build without NCCL, creating one stops with what the build lacks.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "parallel/backend.h"

namespace retort::parallel {

class NcclBackend;

class DeviceBackend : public Backend {
 public:
  DeviceBackend(MPI_Comm comm, int device, const std::string& name);
  ~DeviceBackend() override;
  // The GPU its NCCL communicator lives on.
  int device() const;

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

 private:
  std::shared_ptr<NcclBackend> nccl_;
};

}  // namespace retort::parallel
