// engine/observe/compute_peak.cpp: see compute_peak.h.
#include "engine/observe/compute_peak.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/fma_peak.h"

namespace retort::engine {

ComputePeak measure_compute_peak(int threads) {
  constexpr int64_t kIterations = 4000000;  // tens of milliseconds a round
  threads = std::max(1, threads);
  double best = 1e30, flops = 0;
  std::vector<float> sink(size_t(threads), 0.0f);
  std::vector<double> done(size_t(threads), 0.0);
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {
      for (int64_t t = first; t < last; ++t)
        done[size_t(t)] = kernels::fma_chains(kIterations, &sink[size_t(t)]);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds < best) {
      best = seconds;
      flops = 0;
      for (double d : done) flops += d;
    }
  }
  ComputePeak peak;
  peak.gflops = flops / best / 1e9;
  peak.how = std::string("measured: ") + kernels::isa_name(kernels::kernel_isa()) +
             " fused multiply-add chains on " + std::to_string(threads) + " thread(s)";
  return peak;
}

}  // namespace retort::engine
