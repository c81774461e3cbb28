// engine/train/step_inspector.h: optional observers of a training step, for the consistency
// suite, benchmarks and tools. A production step has none and pays nothing for them.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include "engine/train/step_result.h"
#include "layers/capture.h"

namespace retort::engine {

// Where a pipeline stage's time went in one step's schedule: running its forwards and
// backwards (busy) against the whole schedule, from a barrier of all stages before it to one
// after it (wall); the rest is bubble, imbalance and communication.
struct PipelineTiming {
  double busy_s = 0, wall_s = 0;
};

struct StepInspector {
  // Capture points recorded on every micro-batch: the student's and, when distilling, the
  // teacher's.
  std::set<std::string> captures, teacher_captures;
  // After each micro-batch's forward on this stage, before any loss consumes a capture: the
  // recorded captures (this rank's shards, of this stage's layers) and the position of the
  // micro-batch's first sample in the global batch.
  std::function<void(int64_t step, int64_t first_sample, layers::CaptureSink& student,
                     layers::CaptureSink& teacher)>
      on_captures;
  // After gradients are whole across ranks, before clipping and the optimizer step (under
  // ZeRO-1 a rank then holds the gradients of the parameters it owns only).
  // The result then holds the step, its loss and its terms.
  std::function<void(const StepResult& result)> on_gradients;
  // After the optimizer step (and, under ZeRO-1, the parameter all-gather), with the result
  // complete (the global gradient norm measured before clipping, the learning rate).
  std::function<void(const StepResult& result)> on_step_end;
  // Measure the pipeline bubble: the schedule is framed by two barriers of the pipeline
  // group and timed into pipeline_timing (bench_pipeline). Off in production steps.
  bool time_pipeline = false;
  PipelineTiming pipeline_timing;

  bool inspects_captures() const {
    return on_captures && !(captures.empty() && teacher_captures.empty());
  }
};

}  // namespace retort::engine
