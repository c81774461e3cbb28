// engine/checkpoint.cpp: see checkpoint.h.
#include "engine/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <hdf5.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/user_error.h"
#include "engine/sharding.h"

namespace retort::engine {
namespace fs = std::filesystem;
namespace {

// Closes an HDF5 handle when it goes out of scope.
struct H5Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5Handle() {
    if (id >= 0) close(id);
  }
};

void write_tensor(hid_t file, const std::string& path, const torch::Tensor& tensor) {
  torch::Tensor t = tensor.detach().contiguous().cpu();
  const bool is_double = t.scalar_type() == torch::kDouble;
  if (t.scalar_type() != torch::kDouble && t.scalar_type() != torch::kUInt8 &&
      t.scalar_type() != torch::kLong)
    t = t.to(torch::kFloat);
  hid_t type = is_double ? H5T_NATIVE_DOUBLE
               : t.scalar_type() == torch::kUInt8 ? H5T_NATIVE_UINT8
               : t.scalar_type() == torch::kLong  ? H5T_NATIVE_INT64
                                                  : H5T_NATIVE_FLOAT;
  std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
  H5Handle space{H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose};
  H5Handle lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  H5Handle set{H5Dcreate2(file, path.c_str(), type, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT),
               H5Dclose};
  if (set.id < 0 || H5Dwrite(set.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()) < 0)
    throw UserError("failed to write '" + path + "' to the checkpoint");
}

bool exists(hid_t file, const std::string& path) {
  // Check each prefix: H5Lexists fails on a path whose parent group is missing.
  size_t pos = 0;
  while ((pos = path.find('/', pos + 1)) != std::string::npos)
    if (H5Lexists(file, path.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
  return H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0;
}

// Reads a dataset into a tensor of `dtype` and checks its shape.
torch::Tensor read_tensor(hid_t file, const std::string& file_name, const std::string& path,
                          const std::vector<int64_t>& expected_shape, torch::ScalarType dtype) {
  if (!exists(file, path))
    throw UserError("checkpoint '" + file_name + "' has no '" + path + "'");
  H5Handle set{H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose};
  H5Handle space{H5Dget_space(set.id), H5Sclose};
  const int rank = H5Sget_simple_extent_ndims(space.id);
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  std::vector<int64_t> shape(dims.begin(), dims.end());
  if (!expected_shape.empty() || rank == 0) {
    if (shape != expected_shape) {
      auto fmt = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      throw UserError("checkpoint '" + file_name + "': '" + path + "' has shape " + fmt(shape) +
                      " but the model expects " + fmt(expected_shape));
    }
  }
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  hid_t type = dtype == torch::kDouble  ? H5T_NATIVE_DOUBLE
               : dtype == torch::kUInt8 ? H5T_NATIVE_UINT8
               : dtype == torch::kLong  ? H5T_NATIVE_INT64
                                        : H5T_NATIVE_FLOAT;
  if (H5Dread(set.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()) < 0)
    throw UserError("checkpoint '" + file_name + "': cannot read '" + path + "'");
  return t;
}

void write_scalar(hid_t file, const std::string& name, int64_t value) {
  write_tensor(file, "/progress/" + name, torch::tensor({value}, torch::kLong));
}

int64_t read_scalar(hid_t file, const std::string& file_name, const std::string& name) {
  return read_tensor(file, file_name, "/progress/" + name, {1}, torch::kLong).item<int64_t>();
}

}  // namespace

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld.h5", static_cast<long long>(step));
  return (fs::path(run_dir) / "checkpoints" / name).string();
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

void save_checkpoint(const std::string& path, const layers::ParameterStore& store,
                     AdamW* optimizer, const TrainingProgress& progress,
                     const layers::TensorParallel& tp, bool writer) {
  // Every TP rank takes part in the gathers; only the writer touches the file system.
  std::vector<std::pair<std::string, torch::Tensor>> datasets;
  for (size_t i = 0; i < store.all().size(); ++i) {
    const layers::Parameter& p = store.all()[i];
    datasets.emplace_back("/params/" + p.spec.name, to_global(p.value, p.spec, tp));
    if (optimizer && optimizer->states()[i].exp_avg.defined()) {
      const AdamState& s = optimizer->states()[i];
      datasets.emplace_back("/optimizer/exp_avg/" + p.spec.name,
                            to_global(s.exp_avg, p.spec, tp));
      datasets.emplace_back("/optimizer/exp_avg_sq/" + p.spec.name,
                            to_global(s.exp_avg_sq, p.spec, tp));
    }
  }
  if (!writer) return;
  fs::create_directories(fs::path(path).parent_path());
  const std::string temporary = path + ".partial";
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  {
    H5Handle file{H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                  H5Fclose};
    if (file.id < 0) throw UserError("cannot create checkpoint file '" + temporary + "'");
    for (const auto& [name, tensor] : datasets) write_tensor(file.id, name, tensor);
    write_scalar(file.id, "step", progress.step);
    write_scalar(file.id, "consumed_samples", progress.consumed_samples);
    write_scalar(file.id, "seed", static_cast<int64_t>(progress.seed));
    write_scalar(file.id, "optimizer_steps", optimizer ? optimizer->steps() : 0);
    write_tensor(file.id, "/rng/torch_cpu", at::detail::getDefaultCPUGenerator().get_state());
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

TrainingProgress load_checkpoint(const std::string& path, layers::ParameterStore& store,
                                 AdamW* optimizer, const layers::TensorParallel& tp) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (!fs::is_regular_file(path)) throw UserError("checkpoint file '" + path + "' not found");
  H5Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw UserError("'" + path + "' is not a readable HDF5 checkpoint");
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < store.all().size(); ++i) {
    layers::Parameter& p = store.all()[i];
    const auto dtype = p.value.scalar_type();
    auto load = [&](const std::string& group, torch::Tensor& into) {
      torch::Tensor global = read_tensor(file.id, path, group + p.spec.name, p.spec.shape, dtype);
      into.copy_(from_global(global, p.spec, tp, into));
    };
    load("/params/", p.value);
    if (optimizer && optimizer->states()[i].exp_avg.defined()) {
      load("/optimizer/exp_avg/", optimizer->states()[i].exp_avg);
      load("/optimizer/exp_avg_sq/", optimizer->states()[i].exp_avg_sq);
    }
  }
  TrainingProgress progress;
  progress.step = read_scalar(file.id, path, "step");
  progress.consumed_samples = read_scalar(file.id, path, "consumed_samples");
  progress.seed = static_cast<uint64_t>(read_scalar(file.id, path, "seed"));
  if (optimizer) optimizer->set_steps(read_scalar(file.id, path, "optimizer_steps"));
  torch::Tensor rng = read_tensor(file.id, path, "/rng/torch_cpu",
                                  at::detail::getDefaultCPUGenerator().get_state().sizes().vec(),
                                  torch::kUInt8);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng);
  return progress;
}

}  // namespace retort::engine
