// layers/capture.cpp: see capture.h.
#include "layers/capture.h"

namespace retort::layers {

std::string capture_name(int64_t layer, const std::string& point) {
  return "layers." + std::to_string(layer) + "." + point;
}

const torch::Tensor& CaptureSink::at(const std::string& name) const {
  auto it = values_.find(name);
  TORCH_CHECK(it != values_.end(), "capture point not recorded: ", name);
  return it->second;
}

torch::Tensor CaptureSink::take(const std::string& name) {
  auto it = values_.find(name);
  TORCH_CHECK(it != values_.end(), "capture point not recorded: ", name);
  torch::Tensor value = std::move(it->second);
  values_.erase(it);
  return value;
}

}  // namespace retort::layers
