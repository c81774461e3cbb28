// engine/checkpoint/h5_tensors.h: reading and writing torch tensors as HDF5 datasets (float32,
// float64, uint8, int64), with intermediate groups created on write and shapes checked on read.
// Used by checkpoints and the consistency suite's records.
#pragma once
#include <hdf5.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace retort::engine {

// Closes an HDF5 handle when it goes out of scope.
struct H5Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5Handle() {
    if (id >= 0) close(id);
  }
};

void h5_write_tensor(hid_t file, const std::string& path, const torch::Tensor& tensor);
bool h5_exists(hid_t file, const std::string& path);
// Reads a dataset into a tensor of `dtype`; when expected_shape is given it must match.
// `file_name` names the file in error messages.
torch::Tensor h5_read_tensor(hid_t file, const std::string& file_name, const std::string& path,
                             const std::vector<int64_t>& expected_shape, torch::ScalarType dtype);
// Names of the direct children of a group.
std::vector<std::string> h5_children(hid_t file, const std::string& group);

}  // namespace retort::engine
