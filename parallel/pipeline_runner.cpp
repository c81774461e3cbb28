// parallel/pipeline_runner.cpp: see pipeline_runner.h.
#include "parallel/pipeline_runner.h"

namespace retort::parallel {
namespace {
constexpr int kActivationTag = 100, kGradientTag = 200;

// One stage's side of the messages, as the points of the schedule where it meets a neighbour:
// each exchange posts its sends and receives together and waits for all of them, so a send
// never waits alone for a receive its neighbour posts only after a receive of its own. In the
// steady state a stage's send_forward_recv_backward and its successor's
// send_backward_recv_forward carry the same two messages (activation k forward, gradient j
// back): under NCCL they are one group on each side (nccl_backend.h flushes queued sends and
// receives together at the next wait).
class StageMessages {
 public:
  StageMessages(Communicator& pp, const PipelineStage& stage)
      : pp_(pp), stage_(stage), s_(pp.rank()), first_(s_ == 0), last_(s_ == pp.size() - 1) {}

  torch::Tensor recv_forward() {
    return first_ ? torch::Tensor() : exchange({}, s_ - 1, kActivationTag, activation_shape());
  }
  void send_forward(const torch::Tensor& output) {
    if (!last_) exchange(output, s_ + 1, -1, {});
  }
  torch::Tensor recv_backward() {
    return last_ ? torch::Tensor() : exchange({}, s_ + 1, kGradientTag, gradient_shape());
  }
  void send_backward(const torch::Tensor& input_grad) {
    if (!first_) exchange(input_grad, s_ - 1, -1, {}, kGradientTag);
  }
  torch::Tensor send_forward_recv_backward(const torch::Tensor& output) {
    return last_ ? torch::Tensor()
                 : exchange(output, s_ + 1, kGradientTag, gradient_shape(), kActivationTag);
  }
  torch::Tensor send_backward_recv_forward(const torch::Tensor& input_grad) {
    return first_ ? torch::Tensor()
                  : exchange(input_grad, s_ - 1, kActivationTag, activation_shape(), kGradientTag);
  }

 private:
  std::vector<int64_t> activation_shape() const { return stage_.activation_shape; }
  std::vector<int64_t> gradient_shape() const {
    return stage_.gradient_shape.empty() ? stage_.activation_shape : stage_.gradient_shape;
  }
  // Sends `out` (if defined, with send_tag) to `peer` and receives a tensor of `in_shape` (if
  // recv_tag >= 0) from the same peer, posted together; returns what was received.
  torch::Tensor exchange(const torch::Tensor& out, int peer, int recv_tag,
                         const std::vector<int64_t>& in_shape, int send_tag = kActivationTag) {
    std::vector<Handle> handles;
    torch::Tensor in;
    if (out.defined()) handles.push_back(pp_.send_async(out.contiguous(), peer, send_tag));
    if (recv_tag >= 0) {
      in = torch::empty(in_shape, torch::TensorOptions().dtype(stage_.dtype).device(stage_.device));
      handles.push_back(pp_.recv_async(in, peer, recv_tag));
    }
    for (Handle& h : handles) h.wait();
    return in;
  }

  Communicator& pp_;
  const PipelineStage& stage_;
  const int s_;
  const bool first_, last_;
};
}  // namespace

std::vector<PipelineAction> run_one_forward_one_backward(Communicator& pp, int micro_batches,
                                                         const PipelineStage& stage) {
  // The 1F1B order of pipeline_schedule.h, written as its exchanges (Megatron's form).
  StageMessages messages(pp, stage);
  std::vector<PipelineAction> ran;
  int next_forward = 0, next_backward = 0;
  auto forward = [&](const torch::Tensor& input) {
    ran.push_back({PipelineAction::Forward, next_forward});
    return stage.forward(next_forward++, input);
  };
  auto backward = [&](const torch::Tensor& output_grad) {
    ran.push_back({PipelineAction::Backward, next_backward});
    return stage.backward(next_backward++, output_grad);
  };
  const int warmup = std::min(pp.size() - pp.rank() - 1, micro_batches);
  const int steady = micro_batches - warmup;
  for (int i = 0; i < warmup; ++i) messages.send_forward(forward(messages.recv_forward()));
  torch::Tensor input;
  if (steady > 0) input = messages.recv_forward();
  for (int i = 0; i < steady; ++i) {
    const torch::Tensor output_grad = messages.send_forward_recv_backward(forward(input));
    const torch::Tensor input_grad = backward(output_grad);
    if (i == steady - 1)
      messages.send_backward(input_grad);
    else
      input = messages.send_backward_recv_forward(input_grad);
  }
  for (int i = 0; i < warmup; ++i) messages.send_backward(backward(messages.recv_backward()));
  return ran;
}

void run_forwards(Communicator& pp, int micro_batches, const PipelineStage& stage) {
  StageMessages messages(pp, stage);
  for (int m = 0; m < micro_batches; ++m)
    messages.send_forward(stage.forward(m, messages.recv_forward()));
}

}  // namespace retort::parallel
