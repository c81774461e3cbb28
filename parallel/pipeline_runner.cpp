// parallel/pipeline_runner.cpp: see pipeline_runner.h.
#include "parallel/pipeline_runner.h"

#include <deque>

namespace retort::parallel {
namespace {
constexpr int kActivationTag = 100, kGradientTag = 200;

// One stage's side of the messages: blocking receives, non-blocking sends kept (with their
// tensors) until they complete, in order.
class StageMessages {
 public:
  StageMessages(Communicator& pp, const PipelineStage& stage)
      : pp_(pp), stage_(stage), s_(pp.rank()), first_(s_ == 0), last_(s_ == pp.size() - 1) {}
  ~StageMessages() { pending_.clear(); }  // waits for the sends still in flight

  void forward(int micro_batch) {
    torch::Tensor input;
    if (!first_) input = receive(stage_.activation_shape, s_ - 1, kActivationTag);
    torch::Tensor output = stage_.forward(micro_batch, input);  // undefined on the last
    if (!last_) send(output, s_ + 1, kActivationTag);
  }
  void backward(int micro_batch) {
    torch::Tensor output_grad;
    if (!last_)
      output_grad =
          receive(stage_.gradient_shape.empty() ? stage_.activation_shape : stage_.gradient_shape,
                  s_ + 1, kGradientTag);
    torch::Tensor input_grad = stage_.backward(micro_batch, output_grad);
    if (!first_) send(input_grad, s_ - 1, kGradientTag);
  }
  void retire_finished() {
    while (!pending_.empty() && pending_.front().test()) pending_.pop_front();
  }

 private:
  torch::Tensor receive(const std::vector<int64_t>& shape, int source, int tag) {
    torch::Tensor t =
        torch::empty(shape, torch::TensorOptions().dtype(stage_.dtype).device(stage_.device));
    pp_.recv(t, source, tag);
    return t;
  }
  void send(const torch::Tensor& t, int destination, int tag) {
    pending_.push_back(pp_.send_async(t.contiguous(), destination, tag));
  }

  Communicator& pp_;
  const PipelineStage& stage_;
  const int s_;
  const bool first_, last_;
  std::deque<Handle> pending_;
};
}  // namespace

std::vector<PipelineAction> run_one_forward_one_backward(Communicator& pp, int micro_batches,
                                                         const PipelineStage& stage) {
  StageMessages messages(pp, stage);
  std::vector<PipelineAction> ran;
  for (const PipelineAction& a : one_forward_one_backward(pp.size(), pp.rank(), micro_batches)) {
    if (a.kind == PipelineAction::Forward)
      messages.forward(a.micro_batch);
    else
      messages.backward(a.micro_batch);
    ran.push_back(a);
    messages.retire_finished();
  }
  return ran;
}

void run_forwards(Communicator& pp, int micro_batches, const PipelineStage& stage) {
  StageMessages messages(pp, stage);
  for (int m = 0; m < micro_batches; ++m) {
    messages.forward(m);
    messages.retire_finished();
  }
}

}  // namespace retort::parallel
