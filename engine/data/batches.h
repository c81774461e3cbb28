// engine/data/batches.h: cuts the sample stream into global batches and hands each data-parallel
// rank its micro-batches. Global batch t holds samples [t*G, (t+1)*G) in that order whatever
// the number of DP ranks; rank r takes the contiguous slice r*G/dp .. (r+1)*G/dp.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/data/blended_samples.h"

namespace retort::engine {

struct TokenBatch {
  int64_t batch = 0, seq_len = 0;
  std::vector<int64_t> inputs;   // [batch, seq_len]
  std::vector<int64_t> targets;  // [batch, seq_len], inputs shifted by one
};

class BatchPlan {
 public:
  BatchPlan(int64_t global_batch, int64_t micro_batch, int dp_size, int dp_rank);
  int64_t micro_batches_per_step() const { return micro_per_step_; }
  // First global sample index of micro-batch `micro` of global batch `step` on this rank.
  int64_t first_sample(int64_t step, int64_t micro) const;
  int64_t micro_batch() const { return micro_batch_; }

 private:
  int64_t global_batch_, micro_batch_, micro_per_step_;
  int dp_rank_;
  int64_t per_rank_;
};

TokenBatch read_batch(BlendedSamples& samples, int64_t first_sample, int64_t count);

}  // namespace retort::engine
