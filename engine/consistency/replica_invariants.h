// engine/consistency/replica_invariants.h: the replica invariants of a layout after an optimizer
// step. Every parameter that is not sharded over TP (norm weights, replicated kv heads, biases of
// replicated layers, distillation projections) must be bitwise equal on the ranks of its TP
// group; every parameter bitwise equal across its DP group; and the tied embedding bitwise
// equal on the first and last pipeline stage. A replica that drifts (a gradient summed on
// one rank only, a step taken by one rank) shows up here long before it moves a loss.
#pragma once
#include <string>
#include <vector>

#include "layers/parameters.h"
#include "parallel/mesh.h"

namespace retort::engine {

// Names of the parameters whose copies differ on some rank of `group`, each prefixed with
// `what` ("TP replicas of layers.0.attn_norm.weight differ"). Collective over the group:
// every rank passes the same parameters in the same order and gets the same answer.
std::vector<std::string> differing_replicas(const std::vector<const layers::Parameter*>& params,
                                            parallel::Communicator& group, const std::string& what);

// All three invariants for this rank's parameters; collective over the mesh's TP, DP and
// embedding groups. tied: the embedding is tied to the LM head.
std::vector<std::string> replica_invariant_violations(const layers::ParameterStore& store,
                                                      parallel::Mesh& mesh, bool tied);

}  // namespace retort::engine
