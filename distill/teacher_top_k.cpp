// distill/teacher_top_k.cpp: see teacher_top_k.h.
#include "distill/teacher_top_k.h"

#include <algorithm>
#include <limits>

#include "distill/split_vocabulary.h"
#include "layers/accumulation_type.h"

namespace retort::distill {

TeacherTopK teacher_top_k(const torch::Tensor& local_logits, int64_t vocab_size, int64_t k,
                          double temperature, const layers::TensorParallel& tp) {
  TORCH_CHECK(k >= 1 && k <= vocab_size, "teacher_top_k: k must be in 1 .. vocab_size");
  const int64_t padded_local = local_logits.size(1);
  const int64_t vocab_start = int64_t(tp.rank()) * padded_local;
  const int64_t real = std::clamp<int64_t>(vocab_size - vocab_start, 0, padded_local);
  const torch::Tensor scaled =
      local_logits.narrow(1, 0, real).to(layers::accumulation_type(local_logits)) / temperature;
  const torch::Tensor lse = split_logsumexp(scaled, tp.group);
  const SplitTopK top = split_top_k(scaled, k, padded_local, vocab_start, tp.group);
  TeacherTopK out;
  out.log_probs = top.values - lse.unsqueeze(1);
  out.ids = top.ids;
  // The tail from the entries outside the k themselves (each rank masks those it holds), not
  // as log(1 - their sum): a tail far below the rounding of 1 keeps its digits.
  torch::Tensor rest = scaled.clone();
  const torch::Tensor here = (top.ids >= vocab_start) & (top.ids < vocab_start + real);
  const torch::Tensor rows =
      torch::arange(scaled.size(0), top.ids.options()).unsqueeze(1).expand_as(top.ids);
  rest.index_put_({rows.masked_select(here), top.ids.masked_select(here) - vocab_start},
                  torch::full({}, -std::numeric_limits<double>::infinity(), rest.options()));
  out.tail_log_mass = split_logsumexp(rest, tp.group) - lse;
  return out;
}

}  // namespace retort::distill
