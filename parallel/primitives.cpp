// parallel/primitives.cpp: see primitives.h. Each primitive is a torch autograd Function;
// the communicator travels in the context (common/saved_object.h; it outlives every graph).
#include "parallel/primitives.h"

#include "common/saved_object.h"

namespace retort::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Communicator& comm_of(AutogradContext* ctx) {
  return *saved_object<Communicator*>(ctx, "comm");
}
void keep_comm(AutogradContext* ctx, Communicator& comm) {
  save_object(ctx, "comm", &comm);
}

// Tensor-parallel sums of activations and of their gradients travel and add in the
// activations' own type (ReduceOp::SumNarrow: bf16 on the wire, as NCCL sums it); the
// gradient reductions of parameters (engine/optim) keep float32.
torch::Tensor all_reduced(const torch::Tensor& x, Communicator& comm) {
  torch::Tensor y = x.contiguous().clone();
  comm.all_reduce(y, ReduceOp::SumNarrow);
  return y;
}

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm) {
    keep_comm(ctx, *comm);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {all_reduced(g[0], comm_of(ctx)), torch::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm) {
    return all_reduced(x, *comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {g[0], torch::Tensor()};
  }
};

// Split forward, all-gather backward, along a dimension saved in the context.
struct SplitAlong : torch::autograd::Function<SplitAlong> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm,
                               int64_t dim) {
    keep_comm(ctx, *comm);
    ctx->saved_data["dim"] = dim;
    return split_along(x, dim, *comm).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {comm_of(ctx).all_gather(g[0], dim), torch::Tensor(), torch::Tensor()};
  }
};

// All-gather forward; backward either splits (gather_from_tp) or reduce-scatters
// (gather_from_sp, whose consumers hold partial gradients).
struct GatherAlong : torch::autograd::Function<GatherAlong> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm,
                               int64_t dim, bool reduce_in_backward) {
    keep_comm(ctx, *comm);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reduce"] = reduce_in_backward;
    return comm->all_gather(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    Communicator& comm = comm_of(ctx);
    torch::Tensor gx = ctx->saved_data["reduce"].toBool()
                           ? comm.reduce_scatter(g[0], dim, ReduceOp::SumNarrow)
                           : split_along(g[0], dim, comm).contiguous();
    return {gx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceScatterAlong : torch::autograd::Function<ReduceScatterAlong> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, Communicator* comm,
                               int64_t dim) {
    keep_comm(ctx, *comm);
    ctx->saved_data["dim"] = dim;
    return comm->reduce_scatter(x, dim, ReduceOp::SumNarrow);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {comm_of(ctx).all_gather(g[0], dim), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor split_along(const torch::Tensor& x, int64_t dim, const Communicator& group) {
  if (dim < 0) dim += x.dim();
  const int64_t part = x.size(dim) / group.size();
  return x.narrow(dim, group.rank() * part, part);
}

torch::Tensor copy_to_tp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : CopyToTp::apply(x, &tp);
}
torch::Tensor reduce_from_tp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ReduceFromTp::apply(x, &tp);
}
torch::Tensor scatter_to_tp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : SplitAlong::apply(x, &tp, x.dim() - 1);
}
torch::Tensor gather_from_tp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : GatherAlong::apply(x, &tp, x.dim() - 1, false);
}
torch::Tensor scatter_to_sp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : SplitAlong::apply(x, &tp, kSequenceDim);
}
torch::Tensor gather_from_sp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : GatherAlong::apply(x, &tp, kSequenceDim, true);
}
torch::Tensor reduce_scatter_to_sp(const torch::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ReduceScatterAlong::apply(x, &tp, kSequenceDim);
}

}  // namespace retort::parallel
