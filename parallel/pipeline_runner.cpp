// parallel/pipeline_runner.cpp: see pipeline_runner.h.
#include "parallel/pipeline_runner.h"

#include <deque>

namespace retort::parallel {
namespace {
constexpr int kActivationTag = 100, kGradientTag = 200;
}  // namespace

std::vector<PipelineAction> run_one_forward_one_backward(Communicator& pp, int micro_batches,
                                                         const PipelineStage& stage) {
  const int stages = pp.size(), s = pp.rank();
  const bool first = s == 0, last = s == stages - 1;
  auto options = torch::TensorOptions().dtype(stage.dtype);
  std::deque<Handle> pending_sends;  // completed in order; each keeps its tensor alive
  auto retire_finished = [&] {
    while (!pending_sends.empty() && pending_sends.front().test()) pending_sends.pop_front();
  };
  std::vector<PipelineAction> ran;
  for (const PipelineAction& a : one_forward_one_backward(stages, s, micro_batches)) {
    if (a.kind == PipelineAction::Forward) {
      torch::Tensor input;
      if (!first) {
        input = torch::empty(stage.activation_shape, options);
        pp.recv(input, s - 1, kActivationTag);
      }
      torch::Tensor output = stage.forward(a.micro_batch, input);  // undefined on the last
      if (!last) pending_sends.push_back(pp.send_async(output.contiguous(), s + 1, kActivationTag));
    } else {
      torch::Tensor output_grad;
      if (!last) {
        output_grad = torch::empty(
            stage.gradient_shape.empty() ? stage.activation_shape : stage.gradient_shape, options);
        pp.recv(output_grad, s + 1, kGradientTag);
      }
      torch::Tensor input_grad = stage.backward(a.micro_batch, output_grad);
      if (!first)
        pending_sends.push_back(pp.send_async(input_grad.contiguous(), s - 1, kGradientTag));
    }
    ran.push_back(a);
    retire_finished();
  }
  pending_sends.clear();  // waits for the rest
  return ran;
}

void run_forwards(Communicator& pp, int micro_batches, const PipelineStage& stage) {
  const int s = pp.rank();
  const bool first = s == 0, last = s == pp.size() - 1;
  std::deque<Handle> pending_sends;
  for (int m = 0; m < micro_batches; ++m) {
    torch::Tensor input;
    if (!first) {
      input = torch::empty(stage.activation_shape, torch::TensorOptions().dtype(stage.dtype));
      pp.recv(input, s - 1, kActivationTag);
    }
    torch::Tensor output = stage.forward(m, input);
    if (!last) pending_sends.push_back(pp.send_async(output.contiguous(), s + 1, kActivationTag));
    while (!pending_sends.empty() && pending_sends.front().test()) pending_sends.pop_front();
  }
  pending_sends.clear();
}

}  // namespace retort::parallel
