// layers/compute_copy.h: the weights in the activations' type. Under bf16 mixed precision the
// parameter store keeps float32 main weights (the optimizer's, the checkpoints') and the
// products run in bfloat16; each weight's bf16 copy is cast from its main weight once per change
// of that weight (an optimizer step, a load) and reused by every micro-batch's forward and
// backward until then, as Megatron-LM's bf16 parameters are refreshed from its fp32 main
// parameters after the step.
// A copy is valid while every weight it was cast from has the same storage, place and version
// counter (torch bumps it on every in-place write); a copy is never written in place, so a
// product's backward keeps the values its forward used even if the weight steps in between
// (optimizer-in-backward). Process-wide and keyed by the weights' memory, like
// grad_destinations.h, so the layers keep plain handles to their parameters.
// Not kept (memory.keep_compute_weights false): each use casts a new copy, dropped with its
// last reference, as FSDP's mixed precision casts at each all-gather. The products then save the
// main weight, not the copy, and cast again in backward: no bf16 weight outlives its product,
// at two casts of every weight per micro-batch.
#pragma once
#include <torch/torch.h>

#include <cstdint>

namespace retort::layers {

// `weight` in `type`: the weight itself when it already is, else its cached copy (no autograd
// history: the product's own backward returns the main weight's gradient).
torch::Tensor weight_in(const torch::Tensor& weight, torch::ScalarType type);

// Matrices stacked by rows ([w0; w1; ...], as stacked_rows) in `type`, cached the same way: one
// contiguous copy for the whole stack. `weights` already of that type: stacked_rows' result.
torch::Tensor stacked_weights_in(at::TensorList weights, torch::ScalarType type);

// A small parameter (bias, norm weight) in the activations' type, cast on every use with autograd
// history, so its gradient reaches the parameter in its own type.
inline torch::Tensor in_type_of(const torch::Tensor& parameter, const torch::Tensor& activations) {
  const torch::ScalarType type = activations.scalar_type();
  return parameter.scalar_type() == type ? parameter : parameter.to(type);
}

// While alive, the process's compute copies are kept (keep true; the default outside any scope)
// or cast at each use (keep false); scopes nest. The trainer opens one around each step and
// each evaluation from memory.keep_compute_weights, so trainers alive together (a bench
// alternating their steps) each run with their own.
class ComputeCopyScope {
 public:
  explicit ComputeCopyScope(bool keep);
  ~ComputeCopyScope();
  ComputeCopyScope(const ComputeCopyScope&) = delete;
  ComputeCopyScope& operator=(const ComputeCopyScope&) = delete;

 private:
  bool previous_;
};
bool compute_copies_kept();

// Bytes held by the cached copies (memory accounting, tests).
int64_t compute_copy_bytes();
// Drops every cached copy (tests; the next use casts again).
void clear_compute_copies();

}  // namespace retort::layers
