// engine/observe/gemm_peak.h: measures this machine's fp32 matrix-product rate (GFLOP/s) with the
// threads torch is set to use; the denominator of MFU.
#pragma once
#include <cstdint>

namespace retort::engine {

// Best of `repeats` timed n x n x n products after one warm-up.
double measure_gemm_gflops(int64_t n = 1024, int repeats = 5);

}  // namespace retort::engine
