// parallel/rank_device.cpp: see rank_device.h.
#include "parallel/rank_device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "common/user_error.h"
#include "parallel/transport.h"

namespace retort::parallel {

torch::Device rank_device(bool cuda, int local_rank, int gpus_per_node,
                          const std::string& setting) {
  if (!cuda) return torch::kCPU;
  if (!torch::cuda::is_available())
    throw UserError(setting +
                    ": no GPU is visible to this process (--version says what is compiled in); "
                    "use the CPU");
  const int gpu = gpu_for_local_rank(local_rank, int(torch::cuda::device_count()), gpus_per_node);
  const torch::Device device(torch::kCUDA, gpu);
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
  return device;
}

}  // namespace retort::parallel
