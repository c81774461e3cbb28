// layers/capture.cpp: see capture.h.
#include "layers/capture.h"

namespace retort::layers {

std::string capture_name(int64_t layer, const std::string& point) {
  return "layers." + std::to_string(layer) + "." + point;
}

int64_t capture_layer(const std::string& name) {
  const std::string prefix = "layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  size_t used = 0;
  try {
    const int64_t layer = std::stoll(name.substr(prefix.size()), &used);
    return name.size() > prefix.size() + used && name[prefix.size() + used] == '.' ? layer : -1;
  } catch (const std::exception&) {
    return -1;
  }
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
