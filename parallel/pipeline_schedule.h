// parallel/pipeline_schedule.h: the 1F1B pipeline schedule (PipeDream-Flush, as in
// Megatron): stage s of p runs min(p - s - 1, m) warm-up forwards, then alternates one
// forward and one backward, then drains the remaining backwards. At most p - s micro-batches
// are in flight on stage s. Plain C++: the trainer's pipeline executes this list.
#pragma once
#include <string>
#include <vector>

namespace retort::parallel {

struct PipelineAction {
  enum Kind { Forward, Backward } kind;
  int micro_batch;
  bool operator==(const PipelineAction& o) const {
    return kind == o.kind && micro_batch == o.micro_batch;
  }
};

std::vector<PipelineAction> one_forward_one_backward(int stages, int stage, int micro_batches);
// Largest number of forwards not yet matched by their backward, over the schedule.
int max_in_flight(const std::vector<PipelineAction>& actions);
std::string describe(const std::vector<PipelineAction>& actions);  // e.g. "F0 F1 B0 F2 ..."

}  // namespace retort::parallel
