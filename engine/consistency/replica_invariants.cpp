// engine/consistency/replica_invariants.cpp: see replica_invariants.h.
#include "engine/consistency/replica_invariants.h"

#include <torch/torch.h>

namespace retort::engine {

std::vector<std::string> differing_replicas(const std::vector<const layers::Parameter*>& params,
                                            parallel::Communicator& group,
                                            const std::string& what) {
  if (group.size() == 1 || params.empty()) return {};
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flats;
  for (const layers::Parameter* p : params) flats.push_back(p->value.detach().reshape({-1}));
  torch::Tensor mine = torch::cat(flats);
  // Elementwise maximum and minimum over the group: a parameter is the same everywhere
  // exactly when both equal this rank's copy on every rank.
  torch::Tensor largest = mine.clone(), smallest = -mine;
  group.all_reduce(largest, parallel::ReduceOp::Max);
  group.all_reduce(smallest, parallel::ReduceOp::Max);
  smallest.neg_();
  // The reduced tensors are the same on every rank, so every rank reaches the same verdict.
  std::vector<std::string> found;
  int64_t offset = 0;
  for (const layers::Parameter* p : params) {
    const int64_t n = p->value.numel();
    if (!torch::equal(largest.narrow(0, offset, n), smallest.narrow(0, offset, n)))
      found.push_back(what + " of " + p->spec.name + " differ");
    offset += n;
  }
  return found;
}

std::vector<std::string> replica_invariant_violations(const layers::ParameterStore& store,
                                                      parallel::Mesh& mesh, bool tied) {
  std::vector<const layers::Parameter*> all, tp_replicated, embedding;
  for (const layers::Parameter& p : store.all()) {
    all.push_back(&p);
    if (p.spec.shard_dim < 0) tp_replicated.push_back(&p);
    if (p.spec.name == "embed.weight") embedding.push_back(&p);
  }
  std::vector<std::string> found = differing_replicas(tp_replicated, mesh.tp(), "TP replicas");
  for (std::string& s : differing_replicas(all, mesh.gradient_reduction(), "DP replicas")) found.push_back(s);
  if (tied && mesh.embedding())
    for (std::string& s : differing_replicas(embedding, *mesh.embedding(), "tied embedding copies"))
      found.push_back(s);
  return found;
}

}  // namespace retort::engine
