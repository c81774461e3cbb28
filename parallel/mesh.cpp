// parallel/mesh.cpp: see mesh.h.
#include "parallel/mesh.h"

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

}  // namespace retort::parallel
