// engine/checkpoint/checkpoint.cpp: see checkpoint.h.
#include "engine/checkpoint/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/user_error.h"
#include "engine/checkpoint/h5_tensors.h"
#include "engine/checkpoint/stage_agreement.h"
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

void write_scalar(hid_t file, const std::string& name, int64_t value) {
  h5_write_tensor(file, "/progress/" + name, torch::tensor({value}, torch::kLong));
}

int64_t read_scalar(hid_t file, const std::string& file_name, const std::string& name) {
  return h5_read_tensor(file, file_name, "/progress/" + name, {1}, torch::kLong).item<int64_t>();
}

}  // namespace

std::string model_config_json(const layers::ModelConfig& c) {
  return nlohmann::json(c).dump();
}

layers::ModelConfig model_config_from_json(const std::string& text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw UserError("'" + source + "': unreadable model description");
  try {
    return j.get<layers::ModelConfig>();
  } catch (const nlohmann::json::exception& e) {
    throw UserError("'" + source + "': model description lacks a field (" + e.what() + ")");
  }
}

std::optional<layers::ModelConfig> read_checkpoint_model(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  H5Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw UserError("'" + path + "' is not a readable HDF5 checkpoint");
  if (!h5_exists(file.id, "/model/config_json")) return std::nullopt;
  torch::Tensor bytes = h5_read_tensor(file.id, path, "/model/config_json", {}, torch::kUInt8);
  std::string text(reinterpret_cast<const char*>(bytes.data_ptr()), bytes.numel());
  return model_config_from_json(text, path);
}

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld.h5", static_cast<long long>(step));
  return (fs::path(run_dir) / "checkpoints" / name).string();
}

void prune_checkpoints(const std::string& run_dir, int64_t keep) {
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  if (keep <= 0 || !fs::is_directory(dir)) return;
  std::vector<fs::path> steps;  // zero-padded names: lexical order is step order
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && e.path().extension() == ".h5") steps.push_back(e.path());
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + keep < steps.size(); ++i) fs::remove(steps[i]);
}

std::string resolve_checkpoint(const std::string& target) {
  if (fs::is_regular_file(target)) return target;
  const fs::path latest = fs::path(target) / "checkpoints" / "latest";
  if (fs::is_directory(target) && fs::is_regular_file(latest)) {
    std::ifstream in(latest);
    std::string name;
    in >> name;
    const fs::path file = fs::path(target) / "checkpoints" / name;
    if (fs::is_regular_file(file)) return file.string();
    throw UserError("checkpoint.load: '" + latest.string() + "' names missing file '" +
                    file.string() + "'");
  }
  throw UserError("checkpoint.load: '" + target +
                  "' is neither a checkpoint file nor a run directory with checkpoints/latest");
}

void save_checkpoint(const std::string& path, parallel::Mesh& mesh,
                     const layers::ParameterStore& store, AdamW* optimizer, ZeroPartition* zero,
                     const TrainingProgress& progress) {
  const layers::TensorParallel tp{&mesh.tp()};
  // Every TP rank takes part in the gathers; only the writer touches the file system.
  parallel::NamedTensors datasets;
  for (size_t i = 0; i < store.all().size(); ++i) {
    const layers::Parameter& p = store.all()[i];
    if (p.spec.tied_copy) continue;  // the first stage writes the original
    datasets.emplace_back("/params/" + p.spec.name, to_global(p.value, p.spec, tp));
    if (!optimizer || p.spec.frozen()) continue;
    torch::Tensor m = optimizer->states()[i].exp_avg, v = optimizer->states()[i].exp_avg_sq;
    if (zero) {  // ZeRO-1: the state lives on the parameter's owner only
      if (!m.defined()) m = torch::empty_like(p.value), v = torch::empty_like(p.value);
      zero->group().broadcast(m, zero->owner(i));
      zero->group().broadcast(v, zero->owner(i));
    }
    datasets.emplace_back("/optimizer/exp_avg/" + p.spec.name, to_global(m, p.spec, tp));
    datasets.emplace_back("/optimizer/exp_avg_sq/" + p.spec.name, to_global(v, p.spec, tp));
  }
  if (mesh.coordinates().tp == 0 && mesh.coordinates().dp == 0)
    datasets = parallel::collect_on_first_rank(mesh.pp(), std::move(datasets));
  if (mesh.world_rank() != 0) return;
  fs::create_directories(fs::path(path).parent_path());
  const std::string temporary = path + ".partial";
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  {
    H5Handle file{H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    if (file.id < 0) throw UserError("cannot create checkpoint file '" + temporary + "'");
    for (const auto& [name, tensor] : datasets) h5_write_tensor(file.id, name, tensor);
    write_scalar(file.id, "step", progress.step);
    write_scalar(file.id, "consumed_samples", progress.consumed_samples);
    write_scalar(file.id, "seed", static_cast<int64_t>(progress.seed));
    write_scalar(file.id, "optimizer_steps", optimizer ? optimizer->steps() : 0);
    h5_write_tensor(file.id, "/rng/torch_cpu", at::detail::getDefaultCPUGenerator().get_state());
    if (!progress.model_json.empty()) {
      std::vector<uint8_t> bytes(progress.model_json.begin(), progress.model_json.end());
      h5_write_tensor(file.id, "/model/config_json",
                      torch::from_blob(bytes.data(), {int64_t(bytes.size())}, torch::kUInt8));
    }
  }
  fs::rename(temporary, path);
  // Point "latest" at the new file, again through a rename.
  const fs::path latest = fs::path(path).parent_path() / "latest";
  {
    std::ofstream out(latest.string() + ".partial");
    out << fs::path(path).filename().string() << "\n";
  }
  fs::rename(latest.string() + ".partial", latest);
}

TrainingProgress load_checkpoint(const std::string& path, parallel::Mesh& mesh,
                                 layers::ParameterStore& store, AdamW* optimizer) {
  const layers::TensorParallel tp{&mesh.tp()};
  parallel::Communicator& pipeline = mesh.pp();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (!fs::is_regular_file(path)) throw UserError("checkpoint file '" + path + "' not found");
  H5Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw UserError("'" + path + "' is not a readable HDF5 checkpoint");
  torch::NoGradGuard no_grad;
  // Strict both ways: a model parameter the file lacks fails below; a file parameter the
  // model lacks fails here (distillation projections aside: they belong to a run, not a model).
  // Under pipeline parallelism a name is known when some stage has it.
  const std::vector<std::string> names = h5_children(file.id, "/params");
  torch::Tensor known = torch::zeros({int64_t(names.size())}, torch::kLong);
  for (size_t i = 0; i < names.size(); ++i)
    known[i] = int64_t(store.find(names[i]) || names[i].rfind("distill.", 0) == 0);
  if (pipeline.size() > 1) pipeline.all_reduce(known);
  for (size_t i = 0; i < names.size(); ++i)
    if (known[i].item<int64_t>() == 0)
      throw UserError("checkpoint '" + path + "' has parameter '" + names[i] +
                      "' that this model does not have");
  // A stage missing one of its parameters in the file stops every stage alike.
  run_agreed_over(&pipeline, [&] {
    for (size_t i = 0; i < store.all().size(); ++i) {
      layers::Parameter& p = store.all()[i];
      const auto dtype = p.value.scalar_type();
      auto load = [&](const std::string& group, torch::Tensor& into) {
        torch::Tensor global =
            h5_read_tensor(file.id, path, group + p.spec.name, p.spec.shape, dtype);
        into.copy_(from_global(global, p.spec, tp, into));
      };
      load("/params/", p.value);
      if (optimizer && optimizer->states()[i].exp_avg.defined()) {
        load("/optimizer/exp_avg/", optimizer->states()[i].exp_avg);
        load("/optimizer/exp_avg_sq/", optimizer->states()[i].exp_avg_sq);
      }
    }
  });
  TrainingProgress progress;
  progress.step = read_scalar(file.id, path, "step");
  progress.consumed_samples = read_scalar(file.id, path, "consumed_samples");
  progress.seed = static_cast<uint64_t>(read_scalar(file.id, path, "seed"));
  if (optimizer) optimizer->set_steps(read_scalar(file.id, path, "optimizer_steps"));
  torch::Tensor rng =
      h5_read_tensor(file.id, path, "/rng/torch_cpu",
                     at::detail::getDefaultCPUGenerator().get_state().sizes().vec(), torch::kUInt8);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng);
  return progress;
}

}  // namespace retort::engine
