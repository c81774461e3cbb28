// engine/optim/lr_schedule.h: learning rate per optimizer step: linear warmup from
// lr/warmup to lr, then cosine, linear or constant decay to min_lr over decay_steps, min_lr
// afterwards. Its keys are the optimizer.* schedule keys. No torch here.
#pragma once
#include <cstdint>

#include "common/config_fields.h"

namespace retort::engine {

RETORT_NAMED_ENUM(LrShape, cosine, linear, constant)

#define RETORT_LR_SCHEDULE_KEYS(KEY)                                                       \
  KEY(double, lr, "optimizer.lr", 3e-3, 0, 10, "peak learning rate")                       \
  KEY(double, min_lr, "optimizer.min_lr", 3e-4, 0, 10, "final learning rate")              \
  KEY(LrShape, shape, "optimizer.schedule", LrShape::cosine, 0, 0, "decay after warmup")   \
  KEY(int64_t, warmup_steps, "optimizer.warmup_steps", 10, 0, 1e12, "linear warmup steps") \
  KEY(int64_t, decay_steps, "optimizer.decay_steps", 0, 0, 1e12, "decay length, 0 = training.steps")

struct LrSchedule {
  RETORT_LR_SCHEDULE_KEYS(RETORT_FIELD)
  // step counts from 0 (the first optimizer step).
  double at(int64_t step) const;
};

}  // namespace retort::engine
