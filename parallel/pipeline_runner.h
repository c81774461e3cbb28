// parallel/pipeline_runner.h: executes a 1F1B schedule on one pipeline stage. The stage
// supplies two callbacks; the runner moves activations forward and gradients backward
// between neighbouring stages over the pipeline group, at the schedule's exchange points
// (Megatron's form): in the steady state a stage sends its activation and receives its
// gradient together, and its successor sends that gradient and receives that activation
// together, so each send is posted with the receive it pairs with, as NCCL needs
// (communicator.h, PointToPointRules).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/pipeline_schedule.h"

namespace retort::parallel {

struct PipelineStage {
  // input: the previous stage's output (undefined on the first stage) -> this stage's output
  std::function<torch::Tensor(int micro_batch, const torch::Tensor& input)> forward;
  // output_grad: the next stage's input gradient (undefined on the last stage) -> the
  // gradient of this stage's input (ignored on the first stage)
  std::function<torch::Tensor(int micro_batch, const torch::Tensor& output_grad)> backward;
  std::vector<int64_t> activation_shape;  // what travels forward between stages
  std::vector<int64_t> gradient_shape;    // what travels backward; empty = activation_shape
  torch::ScalarType dtype = torch::kFloat;
  torch::Device device = torch::kCPU;  // where received activations and gradients are placed
};

// Runs `micro_batches` through the stage in 1F1B order over the pipeline group `pp`
// (rank = stage). Returns the actions in the order they ran.
std::vector<PipelineAction> run_one_forward_one_backward(Communicator& pp, int micro_batches,
                                                         const PipelineStage& stage);

// Forwards only (evaluation): every micro-batch through the stage in order; `backward` is
// not called.
void run_forwards(Communicator& pp, int micro_batches, const PipelineStage& stage);

}  // namespace retort::parallel
