// engine/train/step_result.h: what one optimizer step returns: the loss and its named parts
// (global over DP ranks and pipeline stages), the gradient norm before clipping, the
// learning rate it stepped with, whether it was skipped, and where its time went.
#pragma once
#include <cstdint>

#include "distill/loss_terms.h"

namespace retort::engine {

// Wall-clock seconds of one step on this rank, by phase (no barriers: under pipeline
// parallelism forward and backward are this stage's own work, waits excluded).
struct StepTimes {
  double forward_s = 0, backward_s = 0;  // this stage's micro-batch forwards and backwards
  double schedule_s = 0;                 // the whole micro-batch schedule, waits included
  double sync_s = 0;                     // gradient synchronisation left after backward
  double optimizer_s = 0;                // clipping, the optimizer step, ZeRO's all-gather
};

struct StepResult {
  int64_t step = 0;  // the optimizer step just completed, counting from 1
  double loss = 0;
  distill::LossTerms terms;  // lm only, without distillation
  double grad_norm = 0;
  double lr = 0;
  // A non-finite loss or gradient norm on any rank: no parameter, optimizer state or
  // learning-rate position changed (the data position did advance past the batch).
  bool skipped = false;
  // A stop signal reached some rank before this step's agreement: every rank saves and ends.
  bool stop_requested = false;
  int stop_signal = 0;  // which (the largest signal number any rank received)
  StepTimes times;
};

}  // namespace retort::engine
