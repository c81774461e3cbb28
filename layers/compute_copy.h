// layers/compute_copy.h: the weights in the activations' type. Under bf16 mixed precision the
// parameter store keeps float32 main weights (the optimizer's, the checkpoints') and the
// products run in bfloat16; each weight's bf16 copy is cast from its main weight once per change
// of that weight (an optimizer step, a load) and reused by every micro-batch's forward and
// backward until then, as Megatron-LM's bf16 parameters are refreshed from its fp32 main
// parameters after the step.
// A copy is valid while every weight it was cast from has the same storage, place and version
// counter (torch bumps it on every in-place write); a copy is never written in place, so a
// product's backward keeps the values its forward used even if the weight steps in between
// (optimizer-in-backward). One cache per run (layers/run_context.h), keyed by the weights'
// memory, so the layers keep plain handles to their parameters; code outside a run (no cache)
// casts at each use.
// Not kept (memory.keep_compute_weights false): each use casts a new copy, dropped with its
// last reference, as FSDP's mixed precision casts at each all-gather. The products then save the
// main weight, not the copy, and cast again in backward: no bf16 weight outlives its product,
// at two casts of every weight per micro-batch.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>

namespace retort::layers {

// One run's compute copies. keep false (memory.keep_compute_weights): none is kept, each use
// casts anew.
class ComputeCopies {
 public:
  explicit ComputeCopies(bool keep = true);
  ~ComputeCopies();
  ComputeCopies(const ComputeCopies&) = delete;
  ComputeCopies& operator=(const ComputeCopies&) = delete;

  // `weight` in `type`: the weight itself when it already is, else its cached copy (no
  // autograd history: the product's own backward returns the main weight's gradient).
  torch::Tensor weight_in(const torch::Tensor& weight, torch::ScalarType type);
  // Matrices stacked by rows ([w0; w1; ...], as stacked_rows) in `type`, cached the same way:
  // one contiguous copy for the whole stack. `weights` already of that type: stacked_rows'.
  torch::Tensor stacked_weights_in(at::TensorList weights, torch::ScalarType type);

  bool kept() const { return keep_; }
  void set_kept(bool keep) { keep_ = keep; }
  // Bytes held by the cached copies (memory accounting, tests).
  int64_t bytes() const;
  // Drops every cached copy (the next use casts again).
  void clear();

 private:
  struct Cache;
  torch::Tensor cached_copy(at::TensorList weights, torch::ScalarType type);
  bool keep_;
  std::unique_ptr<Cache> cache_;
};

// The same through a run's copies where there is one (null: cast at each use, nothing kept).
torch::Tensor weight_in(ComputeCopies* copies, const torch::Tensor& weight, torch::ScalarType type);
torch::Tensor stacked_weights_in(ComputeCopies* copies, at::TensorList weights,
                                 torch::ScalarType type);
// Whether a product may keep the copy it used for its backward (a run that keeps copies).
bool compute_copies_kept(const ComputeCopies* copies);

// A small parameter (bias, norm weight) in the activations' type, cast on every use with autograd
// history, so its gradient reaches the parameter in its own type.
inline torch::Tensor in_type_of(const torch::Tensor& parameter, const torch::Tensor& activations) {
  const torch::ScalarType type = activations.scalar_type();
  return parameter.scalar_type() == type ? parameter : parameter.to(type);
}

}  // namespace retort::layers
