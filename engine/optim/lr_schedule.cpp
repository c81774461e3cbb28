// engine/optim/lr_schedule.cpp: see lr_schedule.h.
#include "engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace retort::engine {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
  if (shape == LrShape::constant) return lr;
  const int64_t span = std::max<int64_t>(1, decay_steps - warmup_steps);
  const double progress = std::min(1.0, double(step - warmup_steps) / double(span));
  const double fraction =
      shape == LrShape::linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return min_lr + (lr - min_lr) * fraction;
}

}  // namespace retort::engine
