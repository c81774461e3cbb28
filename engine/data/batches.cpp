// engine/data/batches.cpp: see batches.h.
#include "engine/data/batches.h"

namespace retort::engine {

BatchPlan::BatchPlan(int64_t global_batch, int64_t micro_batch, int dp_size, int dp_rank)
    : global_batch_(global_batch),
      micro_batch_(micro_batch),
      micro_per_step_(global_batch / (micro_batch * dp_size)),
      dp_rank_(dp_rank),
      per_rank_(global_batch / dp_size) {}

int64_t BatchPlan::first_sample(int64_t step, int64_t micro) const {
  return step * global_batch_ + dp_rank_ * per_rank_ + micro * micro_batch_;
}

TokenBatch read_batch(BlendedSamples& samples, int64_t first_sample, int64_t count) {
  TokenBatch b;
  b.batch = count;
  b.seq_len = samples.seq_len();
  b.inputs.resize(count * b.seq_len);
  b.targets.resize(count * b.seq_len);
  std::vector<int64_t> window(b.seq_len + 1);
  for (int64_t i = 0; i < count; ++i) {
    samples.sample(first_sample + i, window.data());
    std::copy(window.begin(), window.end() - 1, b.inputs.begin() + i * b.seq_len);
    std::copy(window.begin() + 1, window.end(), b.targets.begin() + i * b.seq_len);
  }
  return b;
}

}  // namespace retort::engine
