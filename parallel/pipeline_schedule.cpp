// parallel/pipeline_schedule.cpp: see pipeline_schedule.h.
#include "parallel/pipeline_schedule.h"

#include <algorithm>

namespace retort::parallel {

std::vector<PipelineAction> one_forward_one_backward(int stages, int stage, int micro_batches) {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineAction> actions;
  int next_forward = 0, next_backward = 0;
  for (int i = 0; i < warmup; ++i) actions.push_back({PipelineAction::Forward, next_forward++});
  for (int i = 0; i < micro_batches - warmup; ++i) {
    actions.push_back({PipelineAction::Forward, next_forward++});
    actions.push_back({PipelineAction::Backward, next_backward++});
  }
  while (next_backward < micro_batches)
    actions.push_back({PipelineAction::Backward, next_backward++});
  return actions;
}

int max_in_flight(const std::vector<PipelineAction>& actions) {
  int in_flight = 0, most = 0;
  for (const PipelineAction& a : actions) {
    in_flight += a.kind == PipelineAction::Forward ? 1 : -1;
    most = std::max(most, in_flight);
  }
  return most;
}

std::string describe(const std::vector<PipelineAction>& actions) {
  std::string text;
  for (const PipelineAction& a : actions)
    text += (text.empty() ? "" : " ") + std::string(a.kind == PipelineAction::Forward ? "F" : "B") +
            std::to_string(a.micro_batch);
  return text;
}

}  // namespace retort::parallel
