// engine/optim/adamw.cpp: see adamw.h.
#include "engine/optim/adamw.h"

#include <torch/csrc/autograd/variable.h>

#include <cmath>

namespace retort::engine {

AdamW::AdamW(layers::ParameterStore& store, const OptimizerConfig& config,
             const std::function<bool(size_t)>& owns)
    : store_(store), config_(config) {
  states_.resize(store.all().size());
  for (size_t i = 0; i < states_.size(); ++i) {
    const auto& p = store.all()[i];
    if (p.spec.frozen() || (owns && !owns(i))) continue;
    states_[i].exp_avg = torch::zeros_like(p.value, torch::MemoryFormat::Contiguous);
    states_[i].exp_avg_sq = torch::zeros_like(p.value, torch::MemoryFormat::Contiguous);
  }
}

void AdamW::step_parameter(size_t index, double lr) {
  layers::Parameter& p = store_.all()[index];
  AdamState& s = states_[index];
  if (!s.exp_avg.defined() || !p.value.grad().defined()) return;
  update(p, p.value, p.value.grad(), s.exp_avg, s.exp_avg_sq, lr);
}

void AdamW::step_rows(size_t index, int64_t row_begin, const torch::Tensor& grad_rows, double lr,
                      const torch::Tensor& skip) {
  layers::Parameter& p = store_.all()[index];
  AdamState& s = states_[index];
  if (!s.exp_avg.defined()) return;
  torch::NoGradGuard no_grad;
  const int64_t rows = grad_rows.size(0);
  torch::Tensor value = p.value.narrow(0, row_begin, rows);
  torch::Tensor m = s.exp_avg.narrow(0, row_begin, rows),
                v = s.exp_avg_sq.narrow(0, row_begin, rows);
  // The skipped rows are few: keep them aside and put them back, rather than gather the rest.
  const bool skipping = skip.defined() && skip.numel() > 0;
  torch::Tensor kept_value, kept_m, kept_v;
  if (skipping) {
    kept_value = value.index_select(0, skip);
    kept_m = m.index_select(0, skip);
    kept_v = v.index_select(0, skip);
  }
  update(p, value, grad_rows, m, v, lr);
  if (skipping) {
    value.index_copy_(0, skip, kept_value);
    m.index_copy_(0, skip, kept_m);
    v.index_copy_(0, skip, kept_v);
  }
}

void AdamW::step_row_list(size_t index, const torch::Tensor& rows, const torch::Tensor& grad_rows,
                          double lr) {
  layers::Parameter& p = store_.all()[index];
  AdamState& s = states_[index];
  if (!s.exp_avg.defined() || rows.numel() == 0) return;
  torch::NoGradGuard no_grad;
  torch::Tensor value = p.value.index_select(0, rows), m = s.exp_avg.index_select(0, rows),
                v = s.exp_avg_sq.index_select(0, rows);
  update(p, value, grad_rows, m, v, lr);
  p.value.index_copy_(0, rows, value);
  s.exp_avg.index_copy_(0, rows, m);
  s.exp_avg_sq.index_copy_(0, rows, v);
}

void AdamW::update(const layers::Parameter& p, const torch::Tensor& value,
                   const torch::Tensor& grad, const torch::Tensor& m, const torch::Tensor& v,
                   double lr) const {
  TORCH_CHECK(steps_ > 0, "AdamW: a parameter stepped before begin_step(): no step counted");
  TORCH_CHECK(value.is_contiguous() && m.is_contiguous() && v.is_contiguous(), "AdamW: parameter '",
              p.spec.name, "' or its state is not contiguous");
  torch::NoGradGuard no_grad;
  const bool decay = p.spec.weight_decay && config_.weight_decay > 0;
  // ATen's fused AdamW (what torch.optim.AdamW(fused=True) runs) reads the bias corrections'
  // step from a float tensor on the parameter's device; it runs on every device and dtype.
  const torch::Tensor step = torch::full({}, double(steps_), value.options().dtype(torch::kFloat));
  at::_fused_adamw_({value}, {grad.contiguous()}, {m}, {v}, {}, {step}, lr * p.spec.lr_scale,
                    config_.beta1, config_.beta2, decay ? config_.weight_decay : 0.0, config_.eps,
                    /*amsgrad=*/false, /*maximize=*/false);
  // The fused kernel writes in place without counting it in the version counter: count it, so
  // what depends on the values sees the change (a mixed-precision compute copy is cast again,
  // layers/compute_copy.h; autograd's saved-tensor check sees a stepped weight).
  torch::autograd::impl::bump_version(value);
}

void AdamW::step(double lr) {
  begin_step();
  for (size_t i = 0; i < states_.size(); ++i) {
    layers::Parameter& p = store_.all()[i];
    AdamState& s = states_[i];
    if (s.exp_avg.defined() && p.value.grad().defined())
      update(p, p.value, p.value.grad(), s.exp_avg, s.exp_avg_sq, lr);
  }
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const AdamState& s : states_)
    if (s.exp_avg.defined()) bytes += 2 * s.exp_avg.numel() * s.exp_avg.element_size();
  return bytes;
}

torch::Tensor grad_square(const layers::Parameter& p) {
  if (!p.value.grad().defined()) return {};
  // The norm in the gradient's type (no full-size copy), squared in float64.
  return p.value.grad().norm().to(torch::kDouble).square();
}

torch::Tensor grad_square_sum(const layers::ParameterStore& store,
                              const std::vector<torch::Tensor>& squares,
                              const layers::TensorParallel& tp,
                              parallel::Communicator* sharded_over,
                              parallel::Communicator* pipeline) {
  torch::Device device = torch::kCPU;
  for (const torch::Tensor& square : squares)
    if (square.defined()) {
      device = square.device();
      break;
    }
  const torch::TensorOptions options = torch::dtype(torch::kDouble).device(device);
  torch::Tensor sharded = torch::zeros({1}, options), replicated = torch::zeros({1}, options);
  for (size_t i = 0; i < store.all().size(); ++i) {
    const layers::Parameter& p = store.all()[i];
    if (p.spec.frozen() || p.spec.tied_copy || !squares[i].defined()) continue;
    (p.spec.shard_dim >= 0 && tp.size() > 1 ? sharded : replicated).add_(squares[i]);
  }
  if (tp.size() > 1) tp.group->all_reduce(sharded);
  torch::Tensor total = sharded + replicated;
  for (parallel::Communicator* group : {sharded_over, pipeline})
    if (group && group->size() > 1) group->all_reduce(total);
  return total;
}

torch::Tensor global_grad_square_sum(const layers::ParameterStore& store,
                                     const layers::TensorParallel& tp,
                                     parallel::Communicator* sharded_over,
                                     parallel::Communicator* pipeline) {
  std::vector<torch::Tensor> squares;
  for (const auto& p : store.all())
    squares.push_back(p.spec.frozen() || p.spec.tied_copy ? torch::Tensor() : grad_square(p));
  return grad_square_sum(store, squares, tp, sharded_over, pipeline);
}

double global_grad_norm(const layers::ParameterStore& store, const layers::TensorParallel& tp,
                        parallel::Communicator* sharded_over, parallel::Communicator* pipeline) {
  return std::sqrt(global_grad_square_sum(store, tp, sharded_over, pipeline).item<double>());
}

double clip_scale(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

void scale_to_norm(layers::ParameterStore& store, double norm, double max_norm) {
  const double scale = clip_scale(norm, max_norm);
  if (scale == 1.0) return;
  torch::NoGradGuard no_grad;
  for (auto& p : store.all())
    if (!p.spec.frozen() && p.value.grad().defined()) p.value.grad().mul_(scale);
}

double clip_grad_norm(layers::ParameterStore& store, double max_norm,
                      const layers::TensorParallel& tp, parallel::Communicator* sharded_over,
                      parallel::Communicator* pipeline) {
  const double norm = global_grad_norm(store, tp, sharded_over, pipeline);
  scale_to_norm(store, norm, max_norm);
  return norm;
}

}  // namespace retort::engine
