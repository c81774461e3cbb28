// engine/teacher_cache/cached_teacher.cpp: see cached_teacher.h.
#include "engine/teacher_cache/cached_teacher.h"

#include <cmath>

#include "common/user_error.h"

namespace retort::engine {

CachedTeacher::CachedTeacher(const std::string& dir, const CacheExpectations& expected)
    : reader_(dir) {
  const TeacherCacheShape& shape = reader_.header().shape;
  const std::string where = "teacher.cache '" + dir + "'";
  reader_.require_fingerprint(expected.fingerprint);
  if (shape.seq_len != expected.seq_len)
    throw UserError(where + " holds samples of " + std::to_string(shape.seq_len) +
                    " tokens; this run's data.seq_len is " + std::to_string(expected.seq_len));
  if (expected.top_k > shape.top_k)
    throw UserError("distill.teacher_top_k=" + std::to_string(expected.top_k) + ", but " + where +
                    " holds the teacher's top " + std::to_string(shape.top_k) +
                    " (write a cache with --top-k " + std::to_string(expected.top_k) + ")");
  if (shape.vocab_size > expected.vocab_size)
    throw UserError(
        where + " was made by a teacher of " + std::to_string(shape.vocab_size) +
        " ids, more than the student's model.vocab_size=" + std::to_string(expected.vocab_size));
  if (expected.samples_drawn > shape.samples)
    throw UserError(where + " holds samples 0 to " + std::to_string(shape.samples - 1) +
                    "; this run draws samples up to " + std::to_string(expected.samples_drawn - 1) +
                    " (training.steps x training.global_batch): write a cache of at least " +
                    std::to_string(expected.samples_drawn) + " samples");
  reader_.require_shards(expected.samples_drawn);
  k_ = expected.top_k > 0 ? expected.top_k : shape.top_k;
}

distill::SparseTeacher CachedTeacher::entries(int64_t first, int64_t count,
                                              torch::Device device) const {
  const TeacherCacheShape& shape = reader_.header().shape;
  const int64_t positions = shape.seq_len, stored_k = shape.top_k;
  torch::Tensor log_probs = torch::empty({count, positions, k_}, torch::kDouble);
  torch::Tensor ids = torch::empty({count, positions, k_}, torch::kLong);
  torch::Tensor tail = torch::empty({count, positions}, torch::kDouble);
  double* lp = log_probs.data_ptr<double>();
  int64_t* id = ids.data_ptr<int64_t>();
  double* tl = tail.data_ptr<double>();
  for (int64_t i = 0; i < count; ++i) {
    const CachedSample sample = reader_.read(first + i);
    for (int64_t p = 0; p < positions; ++p) {
      for (int64_t j = 0; j < k_; ++j) {
        const size_t from = size_t(p * stored_k + j);
        const int64_t to = (i * positions + p) * k_ + j;
        lp[to] = sample.log_probs[from];
        id[to] = sample.ids[from];
      }
      // With fewer entries kept than cached, the tail grows by the dropped ones' mass.
      double tail_value = sample.tail_log_mass[size_t(p)];
      for (int64_t j = k_; j < stored_k; ++j)
        tail_value =
            std::log(std::exp(tail_value) + std::exp(sample.log_probs[size_t(p * stored_k + j)]));
      tl[i * positions + p] = tail_value;
    }
  }
  return {log_probs.to(device), ids.to(device), tail.to(device)};
}

}  // namespace retort::engine
