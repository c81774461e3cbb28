// distill/split_vocabulary.cpp: see split_vocabulary.h.
#include "distill/split_vocabulary.h"

#include <algorithm>
#include <limits>

namespace retort::distill {

void tp_reduce(torch::Tensor& t, parallel::Communicator* group, parallel::ReduceOp op) {
  if (group->size() > 1) group->all_reduce(t, op);
}

torch::Tensor split_logsumexp(const torch::Tensor& x, parallel::Communicator* group) {
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  if (group->size() == 1) return torch::logsumexp(x, -1);  // one fused kernel
  torch::Tensor max = x.size(-1) > 0 ? std::get<0>(x.max(-1)).contiguous()
                                     : torch::full({x.size(0)}, -kInfinity, x.options());
  tp_reduce(max, group, parallel::ReduceOp::Max);
  max.masked_fill_(max == -kInfinity, 0);  // a row with no finite entry: -inf, not NaN
  torch::Tensor sum = (x - max.unsqueeze(-1)).exp().sum(-1).contiguous();
  tp_reduce(sum, group, parallel::ReduceOp::Sum);
  return sum.log() + max;
}

SplitTopK split_top_k(const torch::Tensor& x, int64_t k, int64_t padded_local, int64_t vocab_start,
                      parallel::Communicator* group) {
  const int64_t candidates = std::min(k, padded_local);
  torch::Tensor values =
      torch::full({x.size(0), candidates}, -std::numeric_limits<double>::infinity(), x.options());
  torch::Tensor ids = torch::full({x.size(0), candidates}, -1, torch::kLong);
  const int64_t have = std::min(candidates, x.size(1));
  if (have > 0) {
    auto [top, index] = x.topk(have, 1);
    values.narrow(1, 0, have).copy_(top);
    ids.narrow(1, 0, have).copy_(index + vocab_start);
  }
  if (group->size() > 1) {
    values = group->all_gather(values, 1);
    ids = group->all_gather(ids, 1);
  }
  auto [top, position] = values.topk(k, 1);
  return {top.contiguous(), ids.gather(1, position).contiguous()};
}

}  // namespace retort::distill
