// parallel/mesh.h: the process mesh. Its axes are named (MeshAxis: pipeline, data, tensor, in
// that order, the last fastest-varying: rank = (pp * DP + dp) * TP + tp), and every group is
// the set of ranks that differ only along some of them, made once from MPI_COMM_WORLD with
// MPI_Comm_split (tp, pp, dp, model-parallel = pipeline x tensor, and under pipeline parallelism
// the embedding group: first and last stage of one pipeline). What the engine asks of the mesh
// is named by its job, not by an axis: which slice of the batch this rank reads (data_split)
// and the group that sums gradients and shards the optimizer (gradient_reduction); today both
// are the data axis, and a context or expert axis would change one without the other (as
// torchtitan's ParallelDims derives them). The one parallel context every engine component
// takes whole; a single process gets a mesh of size-one groups.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "parallel/mesh_axes.h"

namespace retort::parallel {

class Mesh {
 public:
  // layout must be resolved (layout.data filled in) for the world size.
  Mesh(const Layout& layout, MPI_Comm world = MPI_COMM_WORLD);
  // One process, no MPI: every group has size one (the embedding group is absent, as
  // without pipeline parallelism).
  static std::unique_ptr<Mesh> single_process();

  const Layout& layout() const { return layout_; }
  const MeshCoordinates& coordinates() const { return coordinates_; }
  int world_rank() const { return world_rank_; }
  Communicator& tp() { return *tp_; }
  Communicator& pp() { return *pp_; }
  Communicator& model_parallel() { return *mp_; }
  // The slice of the batch this rank reads (the data axis).
  DataSplit data_split() const { return {coordinates_.dp, layout_.data}; }
  // The ranks holding the same parameters that together read one global batch: they sum
  // gradients and the step's losses, keep replicas equal, and share ZeRO's optimizer state
  // (the data axis).
  Communicator& gradient_reduction() { return *dp_; }
  Communicator& world() { return *world_; }
  // The first and last stage of this rank's pipeline (same tp and dp coordinates), which
  // keep tied embeddings equal; null off those stages or without pipeline parallelism.
  Communicator* embedding() { return embedding_.get(); }
  // Gathers where every rank of each group keeps its tensors (its host, and `gpu` for this
  // rank, -1 for the CPU; collective over the world) and sets each group's transport by the
  // rules of transport.h. Returns, for the start-up banner, one line per group of more than
  // one rank: its name, transport and where its ranks sit.
  std::vector<std::string> choose_transports(TransportChoice choice, int gpu);
  // This rank's number among the ranks of its host (0 for a single process); collective.
  int local_rank() const;
  // How many ranks share this rank's host (1 for a single process); collective.
  int ranks_on_host() const;
  // After choose_transports: the host name (MPI_Get_processor_name) of every world rank.
  const std::vector<std::string>& host_names() const { return host_names_; }
  // For the start-up banner when the world spans several hosts (else empty): which ranks
  // each host holds, then every TP, PP and DP group with its ranks and host(s), at most
  // `per_kind` groups of each kind.
  std::vector<std::string> describe_hosts(int per_kind = 8) const;
  // One warning per TP group whose ranks sit on more than one host: its all-reduces, in
  // every layer, would cross the network. Empty on one host.
  std::vector<std::string> tp_groups_across_hosts() const;

 private:
  Mesh() = default;
  Layout layout_;
  int world_rank_ = 0;
  MeshCoordinates coordinates_;
  std::vector<std::string> host_names_;  // per world rank, from choose_transports
  std::unique_ptr<Communicator> tp_, pp_, dp_, mp_, world_, embedding_;  // dp_: the data axis
};

}  // namespace retort::parallel
