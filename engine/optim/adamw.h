// engine/optim/adamw.h: AdamW with decoupled weight decay, its state kept apart from the model's
// parameters (so fp32 master state can sit beside bf16 weights later). It steps one
// parameter at a time, which optimizer-in-backward will call from a grad-ready hook.
// Frozen parameters (lr_scale 0) get no state at all.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "engine/config/train_config.h"
#include "layers/parameters.h"
#include "layers/tensor_parallel.h"

namespace retort::engine {

struct AdamState {
  torch::Tensor exp_avg, exp_avg_sq;  // undefined for frozen parameters
};

class AdamW {
 public:
  // owns(i): whether this rank keeps state for and steps parameter i (ZeRO-1 partitions
  // parameters over DP ranks); null = every trainable parameter.
  AdamW(layers::ParameterStore& store, const OptimizerConfig& config,
        const std::function<bool(size_t)>& owns = nullptr);

  // One optimizer step of every parameter this rank steps, at learning rate lr (clip the
  // gradients first: clip_grad_norm, scale_to_norm).
  void step(double lr);
  // Stepping parameter by parameter (optimizer-in-backward): begin_step() counts the step
  // once, then step_parameter(i, lr) updates parameter i from its .grad() at lr * lr_scale.
  void begin_step() { ++steps_; }
  void step_parameter(size_t index, double lr);
  // Rows [row_begin, row_begin + grad_rows.size(0)) of parameter i from grad_rows, except
  // the block-relative rows `skip` (int64; undefined = none), which keep value and state.
  // For a gradient that arrives in row blocks (the LM head's under optimizer-in-backward).
  void step_rows(size_t index, int64_t row_begin, const torch::Tensor& grad_rows, double lr,
                 const torch::Tensor& skip = {});
  // The rows `rows` (int64, distinct) of parameter i from grad_rows [rows, ...].
  void step_row_list(size_t index, const torch::Tensor& rows, const torch::Tensor& grad_rows,
                     double lr);

  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  std::vector<AdamState>& states() { return states_; }
  int64_t state_bytes() const;

 private:
  // The AdamW update of p's elements `value` with state m, v from grad, in place, by ATen's
  // fused AdamW; all four the same shape (the whole parameter or some of its rows).
  void update(const layers::Parameter& p, const torch::Tensor& value, const torch::Tensor& grad,
              const torch::Tensor& m, const torch::Tensor& v, double lr) const;

  layers::ParameterStore& store_;
  OptimizerConfig config_;
  std::vector<AdamState> states_;  // parallel to store_.all()
  int64_t steps_ = 0;
};

// sqrt of the sum of squared gradient elements over trainable parameters, each global
// element counted once: TP-sharded parameters are summed over the TP group, replicated ones
// taken from this rank (they are equal on every rank once gradients are synchronised; DP
// gradients are already summed, so DP adds nothing).
// Under ZeRO-1 (sharded_over non-null) each rank holds the gradients of its own parameters
// only, and the sums are added over that group.
double global_grad_norm(const layers::ParameterStore& store, const layers::TensorParallel& tp = {},
                        parallel::Communicator* sharded_over = nullptr,
                        parallel::Communicator* pipeline = nullptr);
// The square of global_grad_norm, summed and reduced where the gradients are (a float64 [1]
// tensor on their device; nothing read to the host).
torch::Tensor global_grad_square_sum(const layers::ParameterStore& store,
                                     const layers::TensorParallel& tp = {},
                                     parallel::Communicator* sharded_over = nullptr,
                                     parallel::Communicator* pipeline = nullptr);
// The same from each parameter's squared gradient norm (undefined: no gradient), as recorded
// before optimizer-in-backward freed the gradients.
torch::Tensor grad_square_sum(const layers::ParameterStore& store,
                              const std::vector<torch::Tensor>& squares,
                              const layers::TensorParallel& tp = {},
                              parallel::Communicator* sharded_over = nullptr,
                              parallel::Communicator* pipeline = nullptr);
// The squared norm of parameter p's gradient as a float64 scalar tensor on the gradient's
// device (nothing read to the host); undefined without a gradient.
torch::Tensor grad_square(const layers::Parameter& p);
// The factor that brings gradients of global norm `norm` to at most max_norm: 1 when they are
// within it (or max_norm is 0, no clipping), else max_norm / (norm + 1e-6).
double clip_scale(double norm, double max_norm);
// Scales all gradients by clip_scale(norm, max_norm).
void scale_to_norm(layers::ParameterStore& store, double norm, double max_norm);
// Scales all gradients so their global norm is at most max_norm; returns the norm before.
// `pipeline`: the other stages' parameters count too (tied copies once, on their owner).
double clip_grad_norm(layers::ParameterStore& store, double max_norm,
                      const layers::TensorParallel& tp = {},
                      parallel::Communicator* sharded_over = nullptr,
                      parallel::Communicator* pipeline = nullptr);

}  // namespace retort::engine
