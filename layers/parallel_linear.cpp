// layers/parallel_linear.cpp: see parallel_linear.h.
#include "layers/parallel_linear.h"

namespace retort::layers {
namespace {

ParamSpec weight_spec(const LinearSpec& s, int shard_dim) {
  ParamSpec p;
  p.name = s.name + ".weight";
  p.shape = {s.out, s.in};
  p.shard_dim = shard_dim;
  p.init_std = s.init_std;
  return p;
}

ParamSpec bias_spec(const LinearSpec& s, int shard_dim) {
  ParamSpec p;
  p.name = s.name + ".bias";
  p.shape = {s.out};
  p.shard_dim = shard_dim;
  p.init = InitMethod::Zeros;
  p.weight_decay = false;
  return p;
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(const LinearSpec& spec, ParameterStore& store,
                                           const TensorParallel&) {
  weight_ = store.create(weight_spec(spec, 0));
  if (spec.bias) bias_ = store.create(bias_spec(spec, 0));
}

ColumnParallelLinear::ColumnParallelLinear(const LinearSpec& spec, ParameterStore& store,
                                           int64_t row_offset, int64_t rows)
    : row_offset_(row_offset), rows_(rows) {
  ParamSpec w = weight_spec(spec, -1);
  w.tp_partial_grad = true;
  weight_ = store.create(w);
  if (spec.bias) {
    ParamSpec b = bias_spec(spec, -1);
    b.tp_partial_grad = true;
    bias_ = store.create(b);
  }
}

torch::Tensor ColumnParallelLinear::forward(const torch::Tensor& x) const {
  torch::Tensor w = rows_ > 0 ? weight_.narrow(0, row_offset_, rows_) : weight_;
  torch::Tensor y = torch::matmul(x, w.t());
  if (bias_.defined()) y = y + (rows_ > 0 ? bias_.narrow(0, row_offset_, rows_) : bias_);
  return y;
}

RowParallelLinear::RowParallelLinear(const LinearSpec& spec, ParameterStore& store,
                                     const TensorParallel& tp)
    : tp_(tp) {
  weight_ = store.create(weight_spec(spec, 1));
  if (spec.bias) {
    // Added once, after the sum over TP, so it is whole on every rank; under sequence
    // parallelism each rank sees its part of the sequence, so its gradient is partial.
    ParamSpec b = bias_spec(spec, -1);
    b.sequence_replicated = true;
    bias_ = store.create(b);
  }
}

torch::Tensor RowParallelLinear::forward(const torch::Tensor& x) const {
  torch::Tensor y = tp_.exit_row(torch::matmul(x, weight_.t()));
  return bias_.defined() ? y + bias_ : y;
}

}  // namespace retort::layers
