// engine/observe/gemm_peak.h: measures this machine's fp32 matrix-product rate (GFLOP/s) with the
// threads torch is set to use; the denominator of MFU.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace retort::engine {

// Best of `repeats` timed n x n x n products after one warm-up.
double measure_gemm_gflops(int64_t n = 1024, int repeats = 5);
// The same on `device` in `dtype` (a GPU's rate: each product is waited for).
double measure_gemm_gflops_on(const torch::Device& device, torch::ScalarType dtype, int64_t n,
                              int repeats);

}  // namespace retort::engine
