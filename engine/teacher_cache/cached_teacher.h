// engine/teacher_cache/cached_teacher.h: a student run's teacher cache (teacher.cache): opened
// and checked against the run before its first step (the fingerprint fields the run can tell,
// the sequence length, k against distill.teacher_top_k, the vocabulary against the student's,
// the samples the run will draw), then each micro-batch's entries as tensors for the logit loss
// (distill/cached_logit_loss.h). Every failed check is one line naming teacher.cache and the
// field at fault.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>

#include "distill/cached_logit_loss.h"
#include "engine/teacher_cache/cache_store.h"

namespace retort::engine {

struct CacheExpectations {
  // The fields this run can tell (computed on one rank: the others may check fewer).
  std::map<std::string, std::string> fingerprint;
  int64_t seq_len = 0;
  int64_t top_k = 0;          // distill.teacher_top_k; 0 = all the cache holds
  int64_t vocab_size = 0;     // the student's: every cached id must be one of its ids
  int64_t samples_drawn = 0;  // the run's last sample + 1
};

class CachedTeacher {
 public:
  CachedTeacher(const std::string& dir, const CacheExpectations& expected);
  int64_t vocab_size() const { return reader_.header().shape.vocab_size; }
  int64_t top_k() const { return k_; }
  // Samples first .. first + count - 1, position-major: [count, seq_len, k] log-probabilities
  // (float64) and ids, [count, seq_len] tail log-masses; the first top_k() of each position.
  distill::SparseTeacher entries(int64_t first, int64_t count, torch::Device device) const;

 private:
  TeacherCacheReader reader_;
  int64_t k_ = 0;
};

}  // namespace retort::engine
