// parallel/mesh.cpp: see mesh.h.
#include "parallel/mesh.h"

#include <set>
#include <sstream>

namespace retort::parallel {

MeshCoordinates coordinates_of(int rank, const Layout& layout) {
  MeshCoordinates c;
  c.tp = rank % layout.tensor;
  c.dp = (rank / layout.tensor) % layout.data;
  c.pp = rank / (layout.tensor * layout.data);
  return c;
}

Mesh::Mesh(const Layout& layout, MPI_Comm world) : layout_(layout) {
  MPI_Comm_rank(world, &world_rank_);
  coordinates_ = coordinates_of(world_rank_, layout);
  const MeshCoordinates& c = coordinates_;
  auto split = [&](int color, int key, const std::string& name) {
    MPI_Comm comm;
    MPI_Comm_split(world, color, key, &comm);
    return std::make_unique<Communicator>(comm, name);
  };
  const int T = layout.tensor, D = layout.data;
  tp_ = split(c.pp * D + c.dp, c.tp, "tp");
  dp_ = split(c.pp * T + c.tp, c.dp, "dp");
  pp_ = split(c.dp * T + c.tp, c.pp, "pp");
  mp_ = split(c.dp, c.pp * T + c.tp, "model_parallel");
  // First and last stage of each pipeline: they hold the two copies of tied embeddings.
  const int P = layout.pipeline;
  const bool holds_embedding = P > 1 && (c.pp == 0 || c.pp == P - 1);
  MPI_Comm embedding;
  MPI_Comm_split(world, holds_embedding ? c.dp * T + c.tp : MPI_UNDEFINED, c.pp, &embedding);
  if (holds_embedding) embedding_ = std::make_unique<Communicator>(embedding, "embedding");
  MPI_Comm dup;
  MPI_Comm_dup(world, &dup);
  world_ = std::make_unique<Communicator>(dup, "world");
}

std::unique_ptr<Mesh> Mesh::single_process() {
  std::unique_ptr<Mesh> mesh(new Mesh());
  mesh->layout_.data = 1;
  for (auto [group, name] : {std::pair{&mesh->tp_, "tp"},
                             {&mesh->dp_, "dp"},
                             {&mesh->pp_, "pp"},
                             {&mesh->mp_, "model_parallel"},
                             {&mesh->world_, "world"}})
    *group = Communicator::single(name);
  return mesh;
}

namespace {

std::vector<RankPlace> gathered_places(Communicator& group, RankPlace here) {
  std::vector<RankPlace> places(size_t(group.size()));
  if (group.size() == 1) {
    places[0] = here;
    return places;
  }
  int64_t mine[2] = {int64_t(here.host), here.gpu};
  std::vector<int64_t> all(2 * places.size());
  MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, group.mpi());
  for (size_t r = 0; r < places.size(); ++r)
    places[r] = {uint64_t(all[2 * r]), int(all[2 * r + 1])};
  return places;
}

std::string describe(const std::string& name, Transport transport,
                     const std::vector<RankPlace>& places) {
  std::ostringstream line;
  const bool gpus = !places.empty() && places[0].gpu >= 0;
  line << name << ": "
       << (transport == Transport::host_staged ? "host-staged MPI"
           : gpus                              ? "NCCL"
                                               : "MPI");
  std::set<uint64_t> hosts;
  for (const RankPlace& p : places) hosts.insert(p.host);
  line << " (" << places.size() << " ranks on " << hosts.size() << " host(s)";
  if (gpus) {
    line << ", GPUs";
    for (const RankPlace& p : places) line << " " << p.gpu;
  }
  line << ")";
  return line.str();
}

}  // namespace

int Mesh::local_rank() const {
  if (world_->mpi() == MPI_COMM_NULL) return 0;
  MPI_Comm node;
  MPI_Comm_split_type(world_->mpi(), MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  return local;
}

std::vector<std::string> Mesh::choose_transports(TransportChoice choice, int gpu) {
  RankPlace here{0, gpu};
  if (world_->mpi() != MPI_COMM_NULL) {  // the host: the lowest world rank sharing its memory
    MPI_Comm node;
    MPI_Comm_split_type(world_->mpi(), MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node);
    int lowest = world_rank_;
    MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_free(&node);
    here.host = uint64_t(lowest);
  }
  std::vector<std::string> lines;
  std::vector<Communicator*> groups = {tp_.get(), dp_.get(), pp_.get(), mp_.get(), world_.get()};
  if (embedding_) groups.push_back(embedding_.get());
  for (Communicator* group : groups) {
    const std::vector<RankPlace> places = gathered_places(*group, here);
    const Transport transport = transport_for(choice, places, group->name());
    group->set_transport(transport);
    if (group->size() > 1) lines.push_back(describe(group->name(), transport, places));
  }
  return lines;
}

}  // namespace retort::parallel
