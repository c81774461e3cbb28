// engine/optim/zero_partition.cpp: see zero_partition.h.
#include "engine/optim/zero_partition.h"

#include <algorithm>
#include <numeric>

#include "engine/optim/flat_copy.h"

namespace retort::engine {

ZeroPartition::ZeroPartition(const layers::ParameterStore& store, parallel::Communicator& dp)
    : dp_(dp), owner_(store.all().size(), -1), by_rank_(dp.size()), counts_(dp.size(), 0) {
  // Largest parameters first, each to the least-loaded rank: deterministic on every rank.
  std::vector<size_t> order;
  for (size_t i = 0; i < store.all().size(); ++i)
    if (!store.all()[i].spec.frozen()) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return store.all()[a].value.numel() > store.all()[b].value.numel();
  });
  std::vector<int64_t> load(dp.size(), 0);
  for (size_t i : order) {
    const int rank = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = rank;
    load[rank] += store.all()[i].value.numel();
  }
  for (size_t i = 0; i < owner_.size(); ++i)
    if (owner_[i] >= 0) {
      by_rank_[owner_[i]].push_back(i);
      counts_[owner_[i]] += store.all()[i].value.numel();
    }
}

void ZeroPartition::all_gather_parameters(layers::ParameterStore& store) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> mine, all;
  for (size_t i : by_rank_[dp_.rank()]) mine.push_back(store.all()[i].value);
  for (const auto& params : by_rank_)
    for (size_t i : params) all.push_back(store.all()[i].value);
  const int64_t total = std::accumulate(counts_.begin(), counts_.end(), int64_t(0));
  torch::Tensor in =
      mine.empty() ? torch::empty({0}, store.all()[0].value.options()) : flatten(mine);
  torch::Tensor out = torch::empty({total}, in.options().requires_grad(false));
  dp_.all_gather_v_async(in.detach(), out, counts_).wait();
  copy_back(out, all);
}

}  // namespace retort::engine
