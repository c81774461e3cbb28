// distill/formed_gradients.h: the two ends of a logit loss whose gradient is formed in forward
// (the student head's input and weight, chunk by chunk): forward keeps the gradients of
// total = kd * kd_factor + ce * ce_factor and returns {total, kd, ce}, kd and ce plain values;
// backward scales the kept gradients by the incoming one, in place, and hands the weight's to
// its sink (layers/head_grad_sink.h) or to autograd.
#pragma once
#include <torch/torch.h>

#include "common/saved_object.h"
#include "layers/head_grad_sink.h"

namespace retort::distill {

inline torch::autograd::variable_list keep_formed_gradients(
    torch::autograd::AutogradContext* ctx, const torch::Tensor& grad_x, const torch::Tensor& grad_w,
    layers::HeadGradSink* sink, const torch::Tensor& total, const torch::Tensor& kd,
    const torch::Tensor& ce) {
  ctx->save_for_backward({grad_x, grad_w});
  save_object(ctx, "sink", sink);
  ctx->mark_non_differentiable({kd, ce});
  return {total, kd, ce};
}

// inputs: how many inputs the function's forward takes (the gradients of the first two, the
// head's input and weight, are the kept ones; the rest have none).
inline torch::autograd::variable_list scaled_formed_gradients(
    torch::autograd::AutogradContext* ctx, const torch::autograd::variable_list& grad_outputs,
    size_t inputs) {
  auto saved = ctx->get_saved_variables();
  const torch::Tensor& g = grad_outputs[0];
  torch::autograd::variable_list result(inputs);
  if (saved[0].defined()) result[0] = saved[0].mul_(g);  // ours alone: scaled in place
  layers::HeadGradSink* sink = saved_object<layers::HeadGradSink*>(ctx, "sink");
  if (saved[1].defined()) result[1] = layers::deliver_whole_gradient(sink, saved[1].mul_(g));
  return result;
}

}  // namespace retort::distill
