// engine/observe/compute_peak.h: the fp32 peak MFU is measured against. Either the user's
// runtime.peak_gflops (the hardware's datasheet peak per rank), or measured: the FMA chains of
// kernels/fma_peak.h on this rank's threads at once, which no matrix product can pass, so MFU
// stays below 100%. Measured by every rank at the same moment, so ranks that share cores
// measure their share.
#pragma once
#include <string>

namespace retort::engine {

struct ComputePeak {
  double gflops = 0;  // per rank
  std::string how;    // for the banner: where the figure comes from
};

// Best of three rounds of kernels::fma_chains on `threads` threads.
ComputePeak measure_compute_peak(int threads);

}  // namespace retort::engine
