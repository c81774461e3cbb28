// tests/unit/kernel_isa_test.cpp: the instruction-set cap of our hand-vectorised loops
// (kernels/cpu_features.h): RETORT_KERNEL_ISA lowers what the kernels use, the tile products
// follow it, the loops' compiled variants follow it, and the FMA peak's chains count the work of
// the ISA they ran in; and the dispatch point's routes (kernels/dispatch.h). CTest runs this file
// uncapped and capped at baseline (kernel_tests_baseline_isa_core).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/fma_peak.h"
#include "kernels/isa_variants.h"
#include "kernels/tile_gemm.h"

using namespace retort::kernels;

TEST(KernelIsa, FollowsTheEnvironmentCap) {
  const char* cap = std::getenv("RETORT_KERNEL_ISA");
  if (cap && std::strcmp(cap, "baseline") == 0) EXPECT_EQ(kernel_isa(), Isa::baseline);
  if (cap && std::strcmp(cap, "avx2") == 0) EXPECT_NE(kernel_isa(), Isa::avx512);
  // The tile products run their AVX-512 loops exactly when the kernels may use AVX-512.
  EXPECT_EQ(tile_gemm_available(), kernel_isa() == Isa::avx512);
}

// The row, logit and attention loops run the compiled variant the cap allows, so under
// RETORT_KERNEL_ISA=baseline the tests exercise the baseline-ISA code on any machine.
TEST(KernelIsa, LoopsRunTheVariantTheCapAllows) {
  const char* picked = variant_for_isa<const char*>("avx512", "avx2", "baseline");
  EXPECT_STREQ(picked, isa_name(kernel_isa()));
  const char* cap = std::getenv("RETORT_KERNEL_ISA");
  if (cap && std::strcmp(cap, "baseline") == 0) EXPECT_STREQ(picked, "baseline");
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

// The dispatch point (kernels/dispatch.h): in aten mode every operation goes to ATen whatever
// the tensors; in automatic mode CPU float and double go to our loops (the products by the
// size table), and other devices and element types to ATen.
TEST(KernelDispatch, AtenModeSendsEveryOperationToAten) {
  for (Operation op : {Operation::linear_product, Operation::attention, Operation::block_row_loops,
                       Operation::head_cross_entropy, Operation::logit_loss})
    EXPECT_EQ(route(op, {DeviceKind::cpu, ElementType::f32, 128, 64}, KernelMode::aten),
              Route::aten)
        << int(op);
}

TEST(KernelDispatch, AutomaticModeRoutesByDeviceDtypeAndShape) {
  auto route = [](Operation op, const Work& work) {
    return retort::kernels::route(op, work, KernelMode::automatic);
  };
  for (Operation op :
       {Operation::block_row_loops, Operation::head_cross_entropy, Operation::logit_loss}) {
    EXPECT_EQ(route(op, {DeviceKind::cpu, ElementType::f32}), Route::ours) << int(op);
    EXPECT_EQ(route(op, {DeviceKind::cpu, ElementType::f64}), Route::ours) << int(op);
    // The block's row loops and the head's read and write bf16 rows; the logit losses' run on
    // float32 logits only.
    EXPECT_EQ(route(op, {DeviceKind::cpu, ElementType::bf16}),
              op == Operation::logit_loss ? Route::aten : Route::ours)
        << int(op);
    EXPECT_EQ(route(op, {DeviceKind::cpu, ElementType::f16}), Route::aten) << int(op);
    EXPECT_EQ(route(op, {DeviceKind::cuda, ElementType::f32}), Route::aten) << int(op);
  }
  const bool tiles = tile_gemm_available();
  EXPECT_EQ(route(Operation::linear_product, {DeviceKind::cpu, ElementType::f32, 128, 512}),
            tiles ? Route::ours : Route::aten);
  EXPECT_EQ(route(Operation::linear_product, {DeviceKind::cpu, ElementType::f32, 1024, 512}),
            Route::aten);
}
