// engine/observe/gemm_peak.cpp: see gemm_peak.h.
#include "engine/observe/gemm_peak.h"

#include <torch/torch.h>

#include <chrono>

namespace retort::engine {

double measure_gemm_gflops(int64_t n, int repeats) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n}), c = torch::empty({n, n});
  torch::mm_out(c, a, b);
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    torch::mm_out(c, a, b);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * double(n) * n * n / best / 1e9;
}

}  // namespace retort::engine
