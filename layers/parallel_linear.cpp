// layers/parallel_linear.cpp: see parallel_linear.h.
#include "layers/parallel_linear.h"

#include "common/saved_object.h"
#include "layers/compute_copy.h"
#include "layers/grad_destinations.h"
#include "layers/linear_products.h"
#include "layers/widened_products.h"
#include "parallel/background_progress.h"

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

torch::Tensor ColumnParallelLinear::forward(const torch::Tensor& x, RunContext* run) const {
  torch::Tensor y = LinearProduct::apply(x, local_weight(), run);
  if (bias_.defined()) y = y + in_type_of(local_bias(), y);
  return y;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [..., in] times the stacked weights [sum of out, in], transposed. Saves x and the
// weights themselves, not a stacked copy: backward stacks them again (a view when they are
// adjacent, else a copy small next to the products), so no copy lives from forward to
// backward.
struct PackedProduct : torch::autograd::Function<PackedProduct> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, at::TensorList weights,
                               RunContext* run) {
    // The stack as the product used it: a view of adjacent weights, a copy of scattered ones,
    // or under mixed precision their compute copy (layers/compute_copy.h), saved when kept.
    const torch::Tensor used = stacked_weights_in(copies_of(run), weights, x.scalar_type());
    const bool copied = used.scalar_type() != weights[0].scalar_type();
    variable_list saved{x, copied && compute_copies_kept(copies_of(run)) ? used : torch::Tensor()};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    save_object(ctx, "run", run);
    return product_by_transposed(x, used, run);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const std::vector<torch::Tensor> weights(saved.begin() + 2, saved.end());
    const torch::Tensor dy = grads[0];
    RunContext* run = saved_object<RunContext*>(ctx, "run");
    torch::Tensor dx = product_by(
        dy,
        saved[1].defined() ? saved[1]
                           : stacked_weights_in(copies_of(run), weights, x.scalar_type()),
        run);
    parallel::drive_background_progress();  // between the two products
    const int64_t in = x.size(-1), out = dy.size(-1);
    const torch::Tensor dy_t = dy.reshape({-1, out}).t(), x2d = x.reshape({-1, in});
    variable_list result{dx};
    // Memory offered for every weight's gradient, one block in stacking order: one product
    // fills it, and each weight's part is returned as its own tensor (adopted as .grad()).
    std::vector<torch::Tensor> destinations =
        take_stacked_grad_destinations(gradients_of(run), weights);
    if (!destinations.empty()) {
      torch::Tensor stacked = destinations[0].as_strided({out, in}, {in, 1});
      product_into(stacked, dy_t, x2d);
      result.insert(result.end(), destinations.begin(), destinations.end());
      result.push_back(torch::Tensor());  // mode
      return result;
    }
    torch::Tensor dw = matmul_widening(dy_t, x2d);  // autograd casts each part to its weight's type
    int64_t row = 0;
    for (const torch::Tensor& w : weights) {
      result.push_back(dw.narrow(0, row, w.size(0)));
      row += w.size(0);
    }
    result.push_back(torch::Tensor());  // mode
    return result;
  }
};

// Rebinds each tensor to its slice of one new buffer holding their values one after another.
void share_one_buffer(const std::vector<torch::Tensor>& tensors) {
  int64_t total = 0;
  for (const torch::Tensor& t : tensors) total += t.numel();
  torch::NoGradGuard no_grad;
  const torch::Tensor buffer = torch::empty({total}, tensors.front().options());
  int64_t offset = 0;
  for (torch::Tensor t : tensors) {
    torch::Tensor slice = buffer.narrow(0, offset, t.numel()).view(t.sizes());
    slice.copy_(t);
    t.set_data(slice);
    offset += t.numel();
  }
}

}  // namespace

torch::Tensor stacked_rows(at::TensorList matrices) {
  bool adjacent = true;
  int64_t rows = 0;
  for (size_t i = 0; i < matrices.size() && adjacent; ++i) {
    const torch::Tensor& m = matrices[i];
    adjacent = m.dim() == 2 && m.is_contiguous() && m.size(1) == matrices[0].size(1) &&
               m.scalar_type() == matrices[0].scalar_type() && m.is_alias_of(matrices[0]) &&
               m.storage_offset() == matrices[0].storage_offset() + rows * m.size(1);
    rows += m.size(0);
  }
  if (!adjacent) return torch::cat(matrices);
  return matrices[0].as_strided({rows, matrices[0].size(1)}, {matrices[0].size(1), 1});
}

void place_adjacent(const std::vector<const ColumnParallelLinear*>& parts) {
  std::vector<torch::Tensor> weights;
  for (const ColumnParallelLinear* part : parts) {
    if (!part->uses_whole_weight()) return;
    weights.push_back(part->weight());
  }
  share_one_buffer(weights);
}

torch::Tensor packed_column_forward(const std::vector<const ColumnParallelLinear*>& parts,
                                    const torch::Tensor& x, RunContext* run) {
  std::vector<torch::Tensor> weights, biases;
  for (const ColumnParallelLinear* part : parts) {
    weights.push_back(part->local_weight());
    if (part->local_bias().defined()) biases.push_back(part->local_bias());
  }
  torch::Tensor y = PackedProduct::apply(x, at::TensorList(weights), run);
  if (biases.empty()) return y;
  TORCH_CHECK(biases.size() == parts.size(), "packed_column_forward: bias on some parts only");
  return y + in_type_of(torch::cat(biases), y);
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

torch::Tensor RowParallelLinear::forward(const torch::Tensor& x, RunContext* run) const {
  torch::Tensor y = tp_.exit_row(LinearProduct::apply(x, weight_, run));
  return bias_.defined() ? y + in_type_of(bias_, y) : y;
}

}  // namespace retort::layers
