// parallel/mesh.cpp: see mesh.h.
#include "parallel/mesh.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <utility>

#include "parallel/host_names.h"

namespace retort::parallel {

Mesh::Mesh(const Layout& layout, MPI_Comm world) : layout_(layout) {
  MPI_Comm_rank(world, &world_rank_);
  coordinates_ = coordinates_of(world_rank_, layout);
  auto split = [&](const std::vector<MeshAxis>& along, const std::string& name) {
    const GroupPlace place = group_place(world_rank_, layout, along);
    MPI_Comm comm;
    MPI_Comm_split(world, place.color, place.key, &comm);
    return std::make_unique<Communicator>(comm, name);
  };
  tp_ = split({MeshAxis::tensor}, "tp");
  dp_ = split({MeshAxis::data}, "dp");
  pp_ = split({MeshAxis::pipeline}, "pp");
  mp_ = split({MeshAxis::pipeline, MeshAxis::tensor}, "model_parallel");
  // First and last stage of each pipeline: they hold the two copies of tied embeddings.
  const MeshCoordinates& c = coordinates_;
  const int P = layout.pipeline;
  const bool holds_embedding = P > 1 && (c.pp == 0 || c.pp == P - 1);
  const GroupPlace pipeline = group_place(world_rank_, layout, {MeshAxis::pipeline});
  MPI_Comm embedding;
  MPI_Comm_split(world, holds_embedding ? pipeline.color : MPI_UNDEFINED, c.pp, &embedding);
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

namespace {

// This rank's number among the ranks sharing its host's memory, and how many they are.
std::pair<int, int> place_on_host(MPI_Comm world, int world_rank) {
  if (world == MPI_COMM_NULL) return {0, 1};
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  int rank = 0, size = 1;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return {rank, size};
}

}  // namespace

int Mesh::local_rank() const {
  return place_on_host(world_->mpi(), world_rank_).first;
}

int Mesh::ranks_on_host() const {
  return place_on_host(world_->mpi(), world_rank_).second;
}

std::vector<std::string> Mesh::choose_transports(TransportChoice choice, int gpu) {
  RankPlace here{0, gpu};
  host_names_.assign(1, "localhost");
  if (world_->mpi() != MPI_COMM_NULL) host_names_ = gather_host_names(world_->mpi());
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

namespace {

// Every group along one axis: world ranks that share all coordinates but that axis's.
std::vector<std::vector<int>> groups_along(const Layout& layout, int world, MeshAxis along) {
  std::vector<std::vector<int>> groups;
  std::vector<int> colors;  // the group of each color met so far
  for (int r = 0; r < world; ++r) {
    const int color = group_place(r, layout, {along}).color;
    size_t g = 0;
    while (g < colors.size() && colors[g] != color) ++g;
    if (g == colors.size()) {
      colors.push_back(color);
      groups.emplace_back();
    }
    groups[g].push_back(r);
  }
  return groups;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  return text;
}

std::vector<std::string> hosts_of(const std::vector<int>& ranks,
                                  const std::vector<std::string>& names) {
  std::vector<std::string> hosts;
  for (int r : ranks)
    if (std::find(hosts.begin(), hosts.end(), names[size_t(r)]) == hosts.end())
      hosts.push_back(names[size_t(r)]);
  return hosts;
}

std::string joined(const std::vector<std::string>& parts, const char* separator) {
  std::string text;
  for (const std::string& p : parts) text += (text.empty() ? "" : separator) + p;
  return text;
}

}  // namespace

std::vector<std::string> Mesh::describe_hosts(int per_kind) const {
  const int world = int(host_names_.size());
  std::vector<int> everyone(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) everyone[size_t(r)] = r;
  const std::vector<std::string> hosts = hosts_of(everyone, host_names_);
  if (hosts.size() < 2) return {};
  std::vector<std::string> lines;
  std::string line = "hosts:";
  for (const std::string& host : hosts) {
    std::vector<int> on;
    for (int r = 0; r < world; ++r)
      if (host_names_[size_t(r)] == host) on.push_back(r);
    line += " " + host + " [" + ranks_text(on) + "]";
  }
  lines.push_back(line);
  for (auto [along, name] :
       {std::pair{MeshAxis::tensor, "tp"}, {MeshAxis::pipeline, "pp"}, {MeshAxis::data, "dp"}}) {
    const std::vector<std::vector<int>> groups = groups_along(layout_, world, along);
    if (groups.empty() || groups[0].size() < 2) continue;
    line = std::string(name) + " groups:";
    for (size_t g = 0; g < groups.size() && int(g) < per_kind; ++g)
      line += (g ? "; [" : " [") + ranks_text(groups[g]) + "] on " +
              joined(hosts_of(groups[g], host_names_), "+");
    if (int(groups.size()) > per_kind)
      line += "; and " + std::to_string(groups.size() - size_t(per_kind)) + " more";
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> Mesh::tp_groups_across_hosts() const {
  std::vector<std::string> warnings;
  if (layout_.tensor < 2) return warnings;
  for (const std::vector<int>& group :
       groups_along(layout_, int(host_names_.size()), MeshAxis::tensor)) {
    const std::vector<std::string> hosts = hosts_of(group, host_names_);
    if (hosts.size() > 1)
      warnings.push_back(std::string(layout_.sequence_parallel ? "STP" : "TP") + " group [" +
                         ranks_text(group) + "] spans hosts " + joined(hosts, ", ") +
                         ": its all-reduces in every layer cross the network; make " +
                         "parallel.tensor divide the ranks per host");
  }
  return warnings;
}

}  // namespace retort::parallel
