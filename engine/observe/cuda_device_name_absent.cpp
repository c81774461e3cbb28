// engine/observe/cuda_device_name_absent.cpp: cuda_device_name (device_peak.h) in a build
// without CUDA: there is no device to name.
#include "engine/observe/device_peak.h"

namespace retort::engine {

std::string cuda_device_name(int) {
  return "";
}

}  // namespace retort::engine
