// parallel/host_staged_backend.h: the Backend of a group whose transport is host-staged
// (parallel/transport.h): each tensor is copied into a host buffer (pinned when it lives on a
// GPU), moved over MPI there (an MpiBackend on the same communicator), and copied back once the
// operation completes: what ranks sharing one GPU use, NCCL refusing two ranks of one
// communicator on one device. On CPU tensors it is a copy more, which is how it is tested
// without a GPU.
#pragma once
#include "parallel/mpi_backend.h"

namespace retort::parallel {

class HostStagedBackend : public Backend {
 public:
  // Moves the host copies over `mpi`, this rank being `rank` of the group.
  HostStagedBackend(MpiBackend& mpi, int rank) : mpi_(mpi), rank_(rank) {}

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
  MpiBackend& mpi_;
  int rank_;
};

}  // namespace retort::parallel
