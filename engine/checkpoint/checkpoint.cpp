// engine/checkpoint/checkpoint.cpp: see checkpoint.h.
#include "engine/checkpoint/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/fault_injection.h"
#include "common/make_directories.h"
#include "common/user_error.h"
#include "engine/checkpoint/h5_tensors.h"
#include "engine/checkpoint/shard_box.h"
#include "engine/checkpoint/stage_agreement.h"
#include "kernels/crc32c.h"
#include "layers/sharding.h"
#include "parallel/stage_collect.h"

namespace retort::layers {
// ModelConfig <-> JSON with nlohmann's type macro over the members of the model.* key list
// (the indirection expands the list into the macro's arguments), so no member list is
// written twice.
#define RETORT_JSON_MEMBER(type, member, ...) , member
#define RETORT_JSON_TYPE(...) NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(__VA_ARGS__)
RETORT_JSON_TYPE(ModelConfig RETORT_MODEL_KEYS(RETORT_JSON_MEMBER))
#undef RETORT_JSON_TYPE
#undef RETORT_JSON_MEMBER
}  // namespace retort::layers

namespace retort::engine {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndex = "index.json";
constexpr const char* kFormat = "retort-checkpoint";
constexpr int kVersion = 2;

std::string rank_file(int world_rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.h5", world_rank);
  return name;
}

// One stored piece: a box of a global tensor, in one rank's file.
struct Piece {
  std::string file;
  Box box;
  uint32_t crc = 0;
};

struct IndexedTensor {
  std::vector<int64_t> shape;
  std::string dtype;
  std::vector<Piece> pieces;
};

struct CheckpointIndex {
  nlohmann::json header;                         // format, version, progress, model
  std::map<std::string, IndexedTensor> tensors;  // "params/<name>", "exp_avg/<name>", ...
};

CheckpointIndex read_index(const std::string& dir) {
  const fs::path path = fs::path(dir) / kIndex;
  std::ifstream in(path);
  if (!in)
    throw UserError("checkpoint '" + dir + "': no " + kIndex + " (incomplete or not a checkpoint)");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kFormat)
    throw UserError("checkpoint '" + path.string() + "' is not a Retort checkpoint index");
  if (j.value("version", 0) != kVersion)
    throw UserError("checkpoint '" + path.string() + "': format version " +
                    std::to_string(j.value("version", 0)) + ", this build reads " +
                    std::to_string(kVersion));
  CheckpointIndex index;
  try {
    for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it) {
      IndexedTensor t;
      t.shape = it.value().at("shape").get<std::vector<int64_t>>();
      t.dtype = it.value().at("dtype").get<std::string>();
      for (const nlohmann::json& p : it.value().at("pieces"))
        t.pieces.push_back({p.at("file").get<std::string>(),
                            {p.at("offset").get<std::vector<int64_t>>(),
                             p.at("shape").get<std::vector<int64_t>>()},
                            p.at("crc32c").get<uint32_t>()});
      index.tensors[it.key()] = std::move(t);
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint '" + path.string() + "': malformed index (" + e.what() + ")");
  }
  j.erase("tensors");
  index.header = std::move(j);
  return index;
}

torch::ScalarType dtype_of(const std::string& name, const std::string& where) {
  if (name == "float32") return torch::kFloat;
  if (name == "float64") return torch::kDouble;
  throw UserError(where + ": unknown dtype '" + name + "'");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

const char* dtype_name(torch::ScalarType t) {
  return t == torch::kDouble ? "float64" : "float32";
}

// Open rank files of one checkpoint, each opened once.
class RankFiles {
 public:
  explicit RankFiles(std::string dir) : dir_(std::move(dir)) {}
  ~RankFiles() {
    for (auto& [name, id] : open_) H5Fclose(id);
  }
  hid_t get(const std::string& name) {
    if (auto it = open_.find(name); it != open_.end()) return it->second;
    const std::string path = (fs::path(dir_) / name).string();
    const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id < 0) throw UserError("checkpoint file '" + path + "' is missing or unreadable");
    open_[name] = id;
    return id;
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

 private:
  std::string dir_;
  std::map<std::string, hid_t> open_;
};

// Fills `local` (the tensor of the local box `target`, padding beyond it zero) from the
// pieces of tensor `key` that overlap it, each read whole and checked against its checksum.
void assemble(RankFiles& files, const std::string& key, const IndexedTensor& stored,
              const Box& target, torch::Tensor& local) {
  torch::NoGradGuard no_grad;
  local.zero_();
  int64_t covered = 0;
  const torch::ScalarType dtype = dtype_of(stored.dtype, key);
  for (const Piece& piece : stored.pieces) {
    const Box overlap = intersect(piece.box, target);
    if (overlap.empty()) continue;
    torch::Tensor data = h5_read_tensor(files.get(piece.file), files.path(piece.file), "/" + key,
                                        piece.box.shape, dtype);
    if (crc32c(data.data_ptr(), size_t(data.numel() * data.element_size())) != piece.crc)
      throw UserError("checkpoint file '" + files.path(piece.file) + "': tensor '" + key +
                      "' fails its checksum (the file is damaged)");
    torch::Tensor from = data, into = local;
    for (size_t d = 0; d < overlap.shape.size(); ++d) {
      from = from.narrow(int64_t(d), overlap.offset[d] - piece.box.offset[d], overlap.shape[d]);
      into = into.narrow(int64_t(d), overlap.offset[d] - target.offset[d], overlap.shape[d]);
    }
    into.copy_(from);
    covered += overlap.numel();
  }
  if (covered != target.numel())
    throw UserError("checkpoint: the pieces of tensor '" + key + "' cover " +
                    std::to_string(covered) + " of the " + std::to_string(target.numel()) +
                    " entries this rank needs");
}

// Gathers every rank's string to world rank 0 (others get their own back unchanged).
std::vector<std::string> gather_strings(parallel::Communicator& world, const std::string& mine) {
  torch::Tensor length = torch::tensor({int64_t(mine.size())}, torch::kLong);
  torch::Tensor lengths = world.all_gather(length, 0);
  std::vector<int64_t> counts(size_t(world.size()));
  int64_t total = 0;
  for (int r = 0; r < world.size(); ++r) total += counts[size_t(r)] = lengths[r].item<int64_t>();
  torch::Tensor in = torch::empty({int64_t(mine.size())}, torch::kByte);
  std::memcpy(in.data_ptr(), mine.data(), mine.size());
  torch::Tensor out = torch::empty({total}, torch::kByte);
  world.all_gather_v_async(in, out, counts).wait();
  std::vector<std::string> all;
  int64_t at = 0;
  for (int64_t c : counts) {
    all.emplace_back(static_cast<const char*>(out.data_ptr()) + at, size_t(c));
    at += c;
  }
  return all;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::string model_config_json(const layers::ModelConfig& c) {
  return nlohmann::json(c).dump();
}

layers::ModelConfig model_config_from_json(const std::string& text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw UserError("'" + source + "': unreadable model description");
  // Written before these keys existed: their defaults are what such a model was (heads hidden /
  // heads wide, plain RoPE).
  const nlohmann::json defaults = layers::ModelConfig{};
  for (const char* added :
       {"explicit_head_dim", "rope_scaling", "rope_factor", "rope_low_freq_factor",
        "rope_high_freq_factor", "rope_original_context", "rope_attention_factor", "rope_beta_fast",
        "rope_beta_slow"})
    if (!j.contains(added)) j[added] = defaults[added];
  try {
    return j.get<layers::ModelConfig>();
  } catch (const nlohmann::json::exception& e) {
    throw UserError("'" + source + "': model description lacks a field (" + e.what() + ")");
  }
}

std::optional<layers::ModelConfig> read_checkpoint_model(const std::string& path) {
  const CheckpointIndex index = read_index(path);
  if (!index.header.contains("model")) return std::nullopt;
  return model_config_from_json(index.header["model"].dump(), path);
}

int64_t read_checkpoint_seq_len(const std::string& path) {
  return read_index(path).header.value("seq_len", int64_t(0));
}

std::string read_checkpoint_tokenizer(const std::string& path) {
  return read_index(path).header.value("tokenizer", std::string());
}

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return (fs::path(run_dir) / "checkpoints" / name).string();
}

namespace {

std::vector<std::string> step_folders(const std::string& run_dir, bool with_index_only) {
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  std::vector<std::string> steps;  // zero-padded names: lexical order is step order
  if (!fs::is_directory(dir)) return steps;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && e.path().extension().empty() && e.is_directory() &&
        (!with_index_only || fs::is_regular_file(e.path() / kIndex)))
      steps.push_back(e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

}  // namespace

std::vector<std::string> complete_checkpoints(const std::string& run_dir) {
  return step_folders(run_dir, true);
}

std::vector<std::string> checkpoint_folders(const std::string& run_dir) {
  return step_folders(run_dir, false);
}

void prune_checkpoints(const std::string& run_dir, int64_t keep) {
  if (keep <= 0) return;
  const std::vector<std::string> steps = complete_checkpoints(run_dir);  // newest first
  for (size_t i = size_t(keep); i < steps.size(); ++i) fs::remove_all(steps[i]);
}

std::string resolve_checkpoint(const std::string& target) {
  if (fs::is_regular_file(fs::path(target) / kIndex)) return target;
  const fs::path latest = fs::path(target) / "checkpoints" / "latest";
  if (fs::is_directory(target) && fs::is_regular_file(latest)) {
    std::ifstream in(latest);
    std::string name;
    in >> name;
    const fs::path dir = fs::path(target) / "checkpoints" / name;
    if (fs::is_regular_file(dir / kIndex)) return dir.string();
    throw UserError("checkpoint.load: '" + latest.string() + "' names missing checkpoint '" +
                    dir.string() + "'");
  }
  throw UserError("checkpoint.load: '" + target +
                  "' is neither a checkpoint (a directory with index.json) nor a run directory "
                  "with checkpoints/latest");
}

void save_checkpoint(const std::string& path, parallel::Mesh& mesh,
                     const layers::ParameterStore& store, AdamW* optimizer, ZeroPartition* zero,
                     const TrainingProgress& progress, bool point_latest) {
  parallel::Communicator& world = mesh.world();
  const parallel::MeshCoordinates& at = mesh.coordinates();
  const layers::ShardPosition tp{at.tp, mesh.tp().size()};
  const std::string partial = path + ".partial";
  const bool root = mesh.world_rank() == 0;
  // A folder that cannot be made stops every rank with the root's one line.
  run_agreed_over(&world, [&] {
    if (!root) return;
    fs::remove_all(partial);  // a save killed earlier
    make_directories(partial);
  });
  // This rank's pieces: a parameter's local box from the first DP replica (TP-replicated ones
  // from TP rank 0 too); optimizer state from its ZeRO owner, else like the parameter.
  std::vector<std::pair<std::string, torch::Tensor>> pieces;
  std::vector<Box> boxes;
  std::vector<std::vector<int64_t>> global_shapes;
  for (size_t i = 0; i < store.all().size(); ++i) {
    const layers::Parameter& p = store.all()[i];
    if (p.spec.tied_copy) continue;  // the first stage writes the original
    const Box box = local_box(p.spec, tp);
    const bool tp_writer = p.spec.shard_dim >= 0 || at.tp == 0;
    if (box.empty() || !tp_writer) continue;
    auto region = [&](const torch::Tensor& t) {
      torch::Tensor r = t.detach();
      if (p.spec.shard_dim >= 0) r = r.narrow(p.spec.shard_dim, 0, box.shape[p.spec.shard_dim]);
      return r.contiguous().cpu();  // written and checksummed from host memory
    };
    auto add = [&](const std::string& key, const torch::Tensor& t) {
      pieces.emplace_back(key, region(t));
      boxes.push_back(box);
      global_shapes.push_back(p.spec.shape);
    };
    if (at.dp == 0) add("params/" + p.spec.name, p.value);
    if (!optimizer || p.spec.frozen()) continue;
    const int owner = zero ? zero->owner(i) : 0;
    if (at.dp != owner) continue;
    add("optimizer/exp_avg/" + p.spec.name, optimizer->states()[i].exp_avg);
    add("optimizer/exp_avg_sq/" + p.spec.name, optimizer->states()[i].exp_avg_sq);
  }
  const std::string file = rank_file(mesh.world_rank());
  nlohmann::json mine = nlohmann::json::array();
  // A write that fails on any rank (a full disk, a folder made read-only) stops every rank
  // with its one line, and the unfinished folder goes: it would fill the disk for nothing.
  auto agreed_or_cleaned = [&](const std::function<void()>& phase) {
    try {
      run_agreed_over(&world, phase);
    } catch (const UserError&) {
      std::error_code error;
      if (root) fs::remove_all(partial, error);
      throw;
    }
  };
  agreed_or_cleaned([&] {
    if (pieces.empty() && !root) return;
    {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      const std::string file_path = (fs::path(partial) / file).string();
      // A file system without room for this rank's file stops the save before HDF5 starts
      // it: a file HDF5 cannot finish stays open in the library and fails again at exit.
      int64_t bytes = int64_t(1) << 16;  // the file's own structure, generously
      for (const auto& piece : pieces)
        bytes += piece.second.numel() * int64_t(piece.second.element_size());
      std::error_code space_error;
      const fs::space_info space = fs::space(partial, space_error);
      if (!space_error && int64_t(space.available) < bytes)
        throw UserError("cannot write checkpoint file '" + file_path + "': it needs " +
                        std::to_string(bytes) + " bytes and its file system has " +
                        std::to_string(space.available) + " free (no space left)");
      {
        H5Handle h5{H5Fcreate(file_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                    H5Fclose};
        if (h5.id < 0)
          throw UserError("cannot create checkpoint file '" + file_path + "'" +
                          why_writes_fail(partial));
        for (size_t k = 0; k < pieces.size(); ++k) {
          const torch::Tensor& t = pieces[k].second;
          h5_write_tensor(h5.id, "/" + pieces[k].first, t);
          const uint32_t crc = crc32c(t.data_ptr(), size_t(t.numel() * t.element_size()));
          mine.push_back({{"tensor", pieces[k].first},
                          {"offset", boxes[k].offset},
                          {"shape", boxes[k].shape},
                          {"crc32c", crc},
                          {"global_shape", global_shapes[k]},
                          {"dtype", dtype_name(t.scalar_type())}});
        }
        if (root)
          h5_write_tensor(h5.id, "/rng/torch_cpu",
                          at::detail::getDefaultCPUGenerator().get_state());
      }
      fsync_path(file_path);
    }
  });
  if (fault_injected(Fault::KillAfterRankFiles)) ::raise(SIGKILL);
  // Rank 0 collects every rank's pieces into the index, then renames the directory into
  // place: only a checkpoint whose every file is on disk ever has its final name.
  const std::vector<std::string> all = gather_strings(world, mine.dump());
  agreed_or_cleaned([&] {
    if (root) {
      nlohmann::json index = {
          {"format", kFormat},       {"version", kVersion},
          {"step", progress.step},   {"consumed_samples", progress.consumed_samples},
          {"seed", progress.seed},   {"optimizer_steps", optimizer ? optimizer->steps() : 0},
          {"rng_file", rank_file(0)}};
      if (!progress.model_json.empty()) index["model"] = nlohmann::json::parse(progress.model_json);
      if (progress.seq_len > 0) index["seq_len"] = progress.seq_len;
      if (!progress.dtype.empty()) index["dtype"] = progress.dtype;
      if (!progress.tokenizer.empty()) index["tokenizer"] = progress.tokenizer;
      if (progress.data_seed != 0) index["data_seed"] = progress.data_seed;
      nlohmann::json tensors = nlohmann::json::object();
      for (size_t r = 0; r < all.size(); ++r)
        for (const nlohmann::json& p : nlohmann::json::parse(all[r])) {
          nlohmann::json& t = tensors[p["tensor"].get<std::string>()];
          t["shape"] = p["global_shape"];
          t["dtype"] = p["dtype"];
          t["pieces"].push_back({{"file", rank_file(int(r))},
                                 {"offset", p["offset"]},
                                 {"shape", p["shape"]},
                                 {"crc32c", p["crc32c"]}});
        }
      index["tensors"] = tensors;
      {
        std::ofstream out((fs::path(partial) / kIndex).string());
        out << index.dump(1) << "\n";
        if (!out)
          throw UserError("cannot write '" + partial + "/" + kIndex + "'" +
                          why_writes_fail(partial));
      }
      fsync_path((fs::path(partial) / kIndex).string());
      if (fault_injected(Fault::KillBeforeRename)) ::raise(SIGKILL);
      if (fs::exists(path)) fs::remove_all(path);  // the same step saved again
      fs::rename(partial, path);
      fsync_path(fs::path(path).parent_path().string());
      if (fault_injected(Fault::KillBeforeLatest)) ::raise(SIGKILL);
      if (point_latest) {  // through a rename
        const fs::path latest = fs::path(path).parent_path() / "latest";
        {
          std::ofstream out(latest.string() + ".partial");
          out << fs::path(path).filename().string() << "\n";
        }
        fs::rename(latest.string() + ".partial", latest);
      }
    }
  });
  world.barrier();
}

TrainingProgress load_checkpoint(const std::string& path, parallel::Mesh& mesh,
                                 layers::ParameterStore& store, AdamW* optimizer,
                                 bool part_of_model) {
  const layers::ShardPosition tp{mesh.coordinates().tp, mesh.tp().size()};
  parallel::Communicator& pipeline = mesh.pp();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  CheckpointIndex index;
  run_agreed_over(&mesh.world(), [&] { index = read_index(path); });
  torch::NoGradGuard no_grad;
  // Strict both ways: a model parameter the checkpoint lacks fails below; a checkpoint
  // parameter the model lacks fails here (distillation projections aside: they belong to a
  // run, not a model). Under pipeline parallelism a name is known when some stage has it.
  std::vector<std::string> names;
  for (const auto& [key, t] : index.tensors)
    if (key.rfind("params/", 0) == 0) names.push_back(key.substr(7));
  torch::Tensor known = torch::zeros({int64_t(names.size())}, torch::kLong);
  for (size_t i = 0; i < names.size(); ++i)
    known[int64_t(i)] = int64_t(store.find(names[i]) || names[i].rfind("distill.", 0) == 0);
  if (pipeline.size() > 1) pipeline.all_reduce(known);
  for (size_t i = 0; i < names.size(); ++i)
    if (known[int64_t(i)].item<int64_t>() == 0 && !part_of_model)
      throw UserError("checkpoint '" + path + "' has parameter '" + names[i] +
                      "' that this model does not have");
  // A rank missing a tensor, or reading a damaged one, stops every rank alike.
  run_agreed_over(&mesh.world(), [&] {
    RankFiles files(path);
    for (size_t i = 0; i < store.all().size(); ++i) {
      layers::Parameter& p = store.all()[i];
      const Box target = local_box(p.spec, tp);
      auto load = [&](const std::string& key, torch::Tensor& into) {
        auto it = index.tensors.find(key);
        if (it == index.tensors.end())
          throw UserError("checkpoint '" + path + "' lacks tensor '" + key + "'");
        if (it->second.shape != p.spec.shape)
          throw UserError("checkpoint '" + path + "': '" + key + "' has shape " +
                          shape_text(it->second.shape) + " but the model expects " +
                          shape_text(p.spec.shape));
        assemble(files, key, it->second, target, into);
      };
      load("params/" + p.spec.name, p.value);
      if (optimizer && optimizer->states()[i].exp_avg.defined()) {
        load("optimizer/exp_avg/" + p.spec.name, optimizer->states()[i].exp_avg);
        load("optimizer/exp_avg_sq/" + p.spec.name, optimizer->states()[i].exp_avg_sq);
      }
    }
    const std::string rng_file = index.header.value("rng_file", rank_file(0));
    torch::Tensor rng = h5_read_tensor(
        files.get(rng_file), files.path(rng_file), "/rng/torch_cpu",
        at::detail::getDefaultCPUGenerator().get_state().sizes().vec(), torch::kUInt8);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
  });
  TrainingProgress progress;
  progress.step = index.header.value("step", int64_t(0));
  progress.consumed_samples = index.header.value("consumed_samples", int64_t(0));
  progress.seed = index.header.value("seed", uint64_t(0));
  progress.seq_len = index.header.value("seq_len", int64_t(0));
  progress.dtype = index.header.value("dtype", std::string());
  progress.tokenizer = index.header.value("tokenizer", std::string());
  progress.data_seed = index.header.value("data_seed", uint64_t(0));
  if (optimizer) optimizer->set_steps(index.header.value("optimizer_steps", int64_t(0)));
  return progress;
}

struct CheckpointReader::Impl {
  std::string dir;
  CheckpointIndex index;
  mutable RankFiles files;
  explicit Impl(const std::string& d) : dir(d), index(read_index(d)), files(d) {}
};

CheckpointReader::CheckpointReader(const std::string& dir) : impl_(std::make_unique<Impl>(dir)) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}
CheckpointReader::~CheckpointReader() = default;

std::vector<std::string> CheckpointReader::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& [key, t] : impl_->index.tensors)
    if (key.rfind("params/", 0) == 0) names.push_back(key.substr(7));
  return names;
}

std::vector<int64_t> CheckpointReader::shape(const std::string& name) const {
  auto it = impl_->index.tensors.find("params/" + name);
  if (it == impl_->index.tensors.end())
    throw UserError("checkpoint '" + impl_->dir + "' lacks parameter '" + name + "'");
  return it->second.shape;
}

torch::Tensor CheckpointReader::parameter(const std::string& name) const {
  return tensor("params/" + name);
}

torch::Tensor CheckpointReader::tensor(const std::string& key) const {
  auto it = impl_->index.tensors.find(key);
  if (it == impl_->index.tensors.end())
    throw UserError("checkpoint '" + impl_->dir + "' lacks tensor '" + key + "'");
  const std::vector<int64_t>& global = it->second.shape;
  torch::Tensor out = torch::empty(global, torch::dtype(dtype_of(it->second.dtype, key)));
  assemble(impl_->files, key, it->second, {std::vector<int64_t>(global.size(), 0), global}, out);
  return out;
}

}  // namespace retort::engine
