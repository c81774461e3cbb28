// engine/optim/optimizer_config.h: the optimizer.* keys: the learning-rate schedule, AdamW's
// hyper-parameters, global-norm clipping and ZeRO-1. No torch here.
#pragma once
#include "engine/optim/lr_schedule.h"

namespace retort::engine {

#define RETORT_OPTIMIZER_KEYS(KEY)                                                               \
  KEY(double, beta1, "optimizer.beta1", 0.9, 0, 0.999999, "AdamW beta1")                         \
  KEY(double, beta2, "optimizer.beta2", 0.95, 0, 0.999999, "AdamW beta2")                        \
  KEY(double, eps, "optimizer.eps", 1e-8, 0, 1, "AdamW epsilon")                                 \
  KEY(double, weight_decay, "optimizer.weight_decay", 0.1, 0, 10, "decoupled weight decay")      \
  KEY(int64_t, zero_stage, "optimizer.zero_stage", 0, 0, 1,                                      \
      "1 = shard AdamW state over data-parallel ranks (ZeRO-1)")                                 \
  KEY(double, grad_clip, "optimizer.grad_clip", 1.0, 0, kUnbounded, "global-norm clip, 0 = off") \
  KEY(bool, in_backward, "optimizer.in_backward", false, 0, 0,                                   \
      "step each parameter inside the last backward as soon as its gradient is final, and "      \
      "free the gradient (needs optimizer.grad_clip 0)")

struct OptimizerConfig {
  LrSchedule schedule;
  RETORT_OPTIMIZER_KEYS(RETORT_FIELD)
};

}  // namespace retort::engine
