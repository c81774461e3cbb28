// tests/mpi/pipeline_runner_test.cpp: the 1F1B runner with instrumented stages on the world
// as pipeline group. Stage s adds s + 1 to its input (the first stage starts from the
// micro-batch number), the last stage's "loss" is the output, and backward passes the
// gradient 1 back, each stage adding nothing. The test checks, per stage, that forwards and
// backwards ran in the 1F1B order, that at most p - stage micro-batches were in flight at any
// time (counted by the stage itself), and that every value arrived from the right
// micro-batch; under MPI's rules and under NCCL's pairing rules.
#include "parallel/pipeline_runner.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallel/collective_watchdog.h"

using namespace retort::parallel;

namespace {

void run_instrumented_stages(PointToPointRules rules) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  Communicator pp(dup, "pp");
  pp.set_point_to_point_rules(rules);
  const int p = pp.size(), s = pp.rank();
  for (int m : {1, 3, 5, 8}) {
    int in_flight = 0, most_in_flight = 0;
    std::vector<PipelineAction> seen;
    std::map<int, double> inputs;  // micro-batch -> value this stage received
    PipelineStage stage;
    stage.activation_shape = {2};  // [micro-batch id, value]
    stage.dtype = torch::kDouble;
    stage.forward = [&](int micro, const torch::Tensor& input) {
      seen.push_back({PipelineAction::Forward, micro});
      most_in_flight = std::max(most_in_flight, ++in_flight);
      double value = micro;
      if (input.defined()) {
        EXPECT_EQ(int(input[0].item<double>()), micro) << "stage " << s;
        value = input[1].item<double>();
      }
      inputs[micro] = value;
      return torch::tensor({double(micro), value + s + 1}, torch::kDouble);
    };
    stage.backward = [&](int micro, const torch::Tensor& output_grad) {
      seen.push_back({PipelineAction::Backward, micro});
      --in_flight;
      if (output_grad.defined()) {
        EXPECT_EQ(int(output_grad[0].item<double>()), micro);
      }
      return torch::tensor({double(micro), 1.0}, torch::kDouble);
    };
    auto ran = run_one_forward_one_backward(pp, m, stage);
    EXPECT_EQ(describe(seen), describe(one_forward_one_backward(p, s, m))) << "stage " << s;
    EXPECT_EQ(ran, seen);
    EXPECT_LE(most_in_flight, p - s);
    // Stage s received micro + 1 + 2 + ... + s.
    for (const auto& [micro, value] : inputs) EXPECT_EQ(value, micro + s * (s + 1) / 2.0);
    EXPECT_EQ(int(inputs.size()), m);
  }
}

}  // namespace

TEST(PipelineRunner, InstrumentedStagesRunOneForwardOneBackward) {
  run_instrumented_stages(PointToPointRules::mpi);
}

// The same under NCCL's pairing rules (communicator.h): every send waits for its receive to be
// launched, and queued messages launch as one group. A send that waits alone for a receive its
// neighbour posts only after one of its own deadlocks here, and the watchdog ends the job.
TEST(PipelineRunner, UnderNcclPairingRulesNoSendWaitsAlone) {
  const double timeout = collective_timeout();
  set_collective_timeout(60);  // a deadlock ends the job with the watchdog's report
  run_instrumented_stages(PointToPointRules::nccl);
  set_collective_timeout(timeout);
}
