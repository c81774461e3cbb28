// distill/split_vocabulary.h: reductions over a vocabulary split along TP ranks (each rank
// holds the columns [vocab_start, vocab_start + its real width) of [n, vocab]), never
// gathered whole: the log-sum-exp, and the k largest entries with their global ids. Every rank
// of the group calls them alike (they are collective); a rank whose slice is all padding holds
// no column and contributes nothing.
#pragma once
#include <torch/torch.h>

#include "parallel/communicator.h"

namespace retort::distill {

// All-reduces t over `group` (nothing on one rank).
void tp_reduce(torch::Tensor& t, parallel::Communicator* group, parallel::ReduceOp op);

// log-sum-exp over the split vocabulary of x [n, local real columns] -> [n].
torch::Tensor split_logsumexp(const torch::Tensor& x, parallel::Communicator* group);

struct SplitTopK {
  torch::Tensor values;  // [n, k], largest first; -inf where the vocabulary has fewer than k
  torch::Tensor ids;     // [n, k], global ids (int64); -1 beside a -inf value
};
// The k largest entries per row of the split x [n, local real columns], whose first column is
// global id vocab_start. padded_local: the padded slice width, the same on every rank (each
// contributes min(k, padded_local) candidates to the gather).
SplitTopK split_top_k(const torch::Tensor& x, int64_t k, int64_t padded_local, int64_t vocab_start,
                      parallel::Communicator* group);

}  // namespace retort::distill
