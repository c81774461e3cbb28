// engine/lr_schedule.h: learning rate per optimizer step: linear warmup from lr/warmup to lr,
// then cosine, linear or constant decay to min_lr over decay_steps, min_lr afterwards.
#pragma once
#include <cstdint>
#include <string>

namespace retort::engine {

struct LrSchedule {
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0, decay_steps = 0;
  std::string kind = "cosine";
  // step counts from 0 (the first optimizer step).
  double at(int64_t step) const;
};

}  // namespace retort::engine
