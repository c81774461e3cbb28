// tests/unit/kernel_isa_test.cpp: the instruction-set cap of our hand-vectorised loops
// (kernels/cpu_features.h): RETORT_KERNEL_ISA lowers what the kernels use, the tile products
// follow it, and the FMA peak's chains count the work of the ISA they ran in. CTest runs this
// file uncapped and capped at baseline (kernel_tests_baseline_isa_core).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/fma_peak.h"
#include "kernels/tile_gemm.h"

using namespace retort::kernels;

TEST(KernelIsa, FollowsTheEnvironmentCap) {
  const char* cap = std::getenv("RETORT_KERNEL_ISA");
  if (cap && std::strcmp(cap, "baseline") == 0) EXPECT_EQ(kernel_isa(), Isa::baseline);
  if (cap && std::strcmp(cap, "avx2") == 0) EXPECT_NE(kernel_isa(), Isa::avx512);
  // The tile products run their AVX-512 loops exactly when the kernels may use AVX-512.
  EXPECT_EQ(tile_gemm_available(), kernel_isa() == Isa::avx512);
}

// 12 chains of 16, 8 or 4 lanes, two operations each per round.
TEST(KernelIsa, FmaChainsCountTheWorkOfTheirIsa) {
  const int lanes = kernel_isa() == Isa::avx512 ? 16 : kernel_isa() == Isa::avx2 ? 8 : 4;
  float sink = 0;
  EXPECT_EQ(fma_chains(1000, &sink), 1000.0 * 12 * lanes * 2);
  // Each lane converges to b / (1 - a) = 1e-7 / 0.001 from its start value i in [0, 12).
  EXPECT_TRUE(std::isfinite(sink));
  EXPECT_GT(sink, 0.0f);
}
