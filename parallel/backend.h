// parallel/backend.h: how one group moves tensors, as an object (Backend): each collective and
// each message is one call on it. Communicator (communicator.h) picks a group's backend per
// tensor (MpiBackend for CPU tensors, DeviceBackend for CUDA ones, HostStagedBackend where the
// group's transport is host-staged) and keeps what is the same for all of them: the checks,
// the group-of-one shortcuts, the byte counters and the widening of 16-bit sums. A backend is
// handed the tensors it moves as they are: a sum's buffer already in the type it adds in.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "parallel/handle.h"

namespace retort::parallel {

// Sum and Max reduce 16-bit floats in float32 (widened before, rounded once after: MPI has no
// bfloat16 type, and rounding at every step of a ring or tree would make the sum depend on the
// number of ranks). SumNarrow moves and sums them in their own type: half the bytes, each
// partial sum rounded, as NCCL's bf16 sums do (the tensor-parallel activation sums, and the DP
// sums under parallel.dp_reduce_dtype=bfloat16); for other types it is Sum. The widening is
// the Communicator's; a backend sums the buffer it is given in that buffer's type.
enum class ReduceOp { Sum, Max, SumNarrow };

class Backend {
 public:
  virtual ~Backend() = default;
  // In place, over the group.
  virtual Handle all_reduce(torch::Tensor& buffer, ReduceOp op) = 0;
  // out (size x in's elements) gets every rank's in, in rank order.
  virtual Handle all_gather(const torch::Tensor& in, torch::Tensor& out) = 0;
  // out gets this rank's 1/size slice of the sum of every rank's in.
  virtual Handle reduce_scatter(const torch::Tensor& in, torch::Tensor& out, ReduceOp op) = 0;
  // Rank r gets / contributes counts[r] elements; in (reduce_scatter_v) and out (all_gather_v)
  // hold the ranks' parts in rank order.
  virtual Handle reduce_scatter_v(const torch::Tensor& in, torch::Tensor& out,
                                  const std::vector<int64_t>& counts, ReduceOp op) = 0;
  virtual Handle all_gather_v(const torch::Tensor& in, torch::Tensor& out,
                              const std::vector<int64_t>& counts) = 0;
  virtual Handle broadcast(torch::Tensor& tensor, int root) = 0;
  virtual Handle send(const torch::Tensor& tensor, int destination, int tag) = 0;
  virtual Handle recv(torch::Tensor& tensor, int source, int tag) = 0;
};

}  // namespace retort::parallel
