// engine/observe/gemm_peak.cpp: see gemm_peak.h.
#include "engine/observe/gemm_peak.h"

#include <torch/torch.h>

#include <chrono>

namespace retort::engine {

double measure_gemm_gflops_on(const torch::Device& device, torch::ScalarType dtype, int64_t n,
                              int repeats) {
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options),
                c = torch::empty({n, n}, options);
  auto wait = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  torch::mm_out(c, a, b);
  wait();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    torch::mm_out(c, a, b);
    wait();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * double(n) * n * n / best / 1e9;
}

double measure_gemm_gflops(int64_t n, int repeats) {
  return measure_gemm_gflops_on(torch::kCPU, torch::kFloat, n, repeats);
}

}  // namespace retort::engine
