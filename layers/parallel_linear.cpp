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

torch::Tensor ColumnParallelLinear::local_weight() const {
  return rows_ > 0 ? weight_.narrow(0, row_offset_, rows_) : weight_;
}

torch::Tensor ColumnParallelLinear::local_bias() const {
  if (!bias_.defined()) return bias_;
  return rows_ > 0 ? bias_.narrow(0, row_offset_, rows_) : bias_;
}

torch::Tensor ColumnParallelLinear::forward(const torch::Tensor& x) const {
  torch::Tensor y = torch::matmul(x, local_weight().t());
  if (bias_.defined()) y = y + local_bias();
  return y;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [..., in] times the stacked weights [sum of out, in], transposed. Saves x and the
// weights themselves, not their stacked copy: backward stacks them again (a copy small next
// to the products), so the copy never lives from forward to backward.
struct PackedProduct : torch::autograd::Function<PackedProduct> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, at::TensorList weights) {
    variable_list saved{x};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    return torch::matmul(x, torch::cat(weights).t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const std::vector<torch::Tensor> weights(saved.begin() + 1, saved.end());
    const torch::Tensor dy = grads[0];
    torch::Tensor dx = torch::matmul(dy, torch::cat(weights));
    const int64_t in = x.size(-1), out = dy.size(-1);
    torch::Tensor dw = torch::matmul(dy.reshape({-1, out}).t(), x.reshape({-1, in}));
    variable_list result{dx};
    int64_t row = 0;
    for (const torch::Tensor& w : weights) {
      result.push_back(dw.narrow(0, row, w.size(0)));
      row += w.size(0);
    }
    return result;
  }
};

}  // namespace

torch::Tensor packed_column_forward(const std::vector<const ColumnParallelLinear*>& parts,
                                    const torch::Tensor& x) {
  std::vector<torch::Tensor> weights, biases;
  for (const ColumnParallelLinear* part : parts) {
    weights.push_back(part->local_weight());
    if (part->local_bias().defined()) biases.push_back(part->local_bias());
  }
  torch::Tensor y = PackedProduct::apply(x, at::TensorList(weights));
  if (biases.empty()) return y;
  TORCH_CHECK(biases.size() == parts.size(), "packed_column_forward: bias on some parts only");
  return y + torch::cat(biases);
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
