// engine/checkpoint/h5_tensors.cpp: see h5_tensors.h.
#include "engine/checkpoint/h5_tensors.h"

#include "common/make_directories.h"
#include "common/user_error.h"

namespace retort::engine {

void h5_write_tensor(hid_t file, const std::string& path, const torch::Tensor& tensor) {
  torch::Tensor t = tensor.detach().contiguous().cpu();
  const bool is_double = t.scalar_type() == torch::kDouble;
  if (t.scalar_type() != torch::kDouble && t.scalar_type() != torch::kUInt8 &&
      t.scalar_type() != torch::kLong)
    t = t.to(torch::kFloat);
  hid_t type = is_double                          ? H5T_NATIVE_DOUBLE
               : t.scalar_type() == torch::kUInt8 ? H5T_NATIVE_UINT8
               : t.scalar_type() == torch::kLong  ? H5T_NATIVE_INT64
                                                  : H5T_NATIVE_FLOAT;
  std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
  H5Handle space{H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose};
  H5Handle lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  H5Handle set{H5Dcreate2(file, path.c_str(), type, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT),
               H5Dclose};
  if (set.id < 0 || H5Dwrite(set.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()) < 0) {
    const int saved = errno;
    char name[4096] = {};
    H5Fget_name(file, name, sizeof name);
    throw UserError("failed to write '" + path + "' to the checkpoint file '" + name + "'" +
                    why_writes_fail(std::filesystem::path(name).parent_path().string(), saved));
  }
}

bool h5_exists(hid_t file, const std::string& path) {
  // Check each prefix: H5Lexists fails on a path whose parent group is missing.
  size_t pos = 0;
  while ((pos = path.find('/', pos + 1)) != std::string::npos)
    if (H5Lexists(file, path.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
  return H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0;
}

// Reads a dataset into a tensor of `dtype` and checks its shape.
torch::Tensor h5_read_tensor(hid_t file, const std::string& file_name, const std::string& path,
                             const std::vector<int64_t>& expected_shape, torch::ScalarType dtype) {
  if (!h5_exists(file, path))
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

std::vector<std::string> h5_children(hid_t file, const std::string& group) {
  std::vector<std::string> names;
  if (!h5_exists(file, group)) return names;
  H5Handle g{H5Gopen2(file, group.c_str(), H5P_DEFAULT), H5Gclose};
  H5G_info_t info;
  H5Gget_info(g.id, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t length =
        H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::string name(length, '\0');
    H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), length + 1,
                       H5P_DEFAULT);
    names.push_back(name);
  }
  return names;
}

}  // namespace retort::engine
