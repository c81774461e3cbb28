// engine/observe/cuda_device_name.cpp: cuda_device_name (device_peak.h), built with CUDA.
#include <cuda_runtime_api.h>

#include "engine/observe/device_peak.h"

namespace retort::engine {

std::string cuda_device_name(int index) {
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) return "";
  return properties.name;
}

}  // namespace retort::engine
