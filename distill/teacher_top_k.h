// distill/teacher_top_k.h: what a teacher cache stores for each position, from the teacher's
// vocabulary-split logits: the k largest log-probabilities at temperature T (normalised over
// the whole vocabulary), their global ids, and the log of the probability mass outside them
// (the tail, -inf when the k are the whole vocabulary). Collective over the TP group; every rank
// gets the same result; nothing [n, vocab] is gathered.
#pragma once
#include <torch/torch.h>

#include "layers/tensor_parallel.h"

namespace retort::distill {

struct TeacherTopK {
  torch::Tensor log_probs;      // [n, k], largest first, in the logits' (accumulation) type
  torch::Tensor ids;            // [n, k], int64
  torch::Tensor tail_log_mass;  // [n]
};

// local_logits [n, padded_vocab / tp]: this rank's slice (padding columns may hold anything:
// only the ids below vocab_size count). k: 1 .. vocab_size.
TeacherTopK teacher_top_k(const torch::Tensor& local_logits, int64_t vocab_size, int64_t k,
                          double temperature, const layers::TensorParallel& tp);

}  // namespace retort::distill
