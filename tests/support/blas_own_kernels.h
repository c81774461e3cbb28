// tests/support/blas_own_kernels.h: the test programs run MKL on the kernels MKL picks for
// this CPU. The tests that compare the optimizer step inside backward with the plain step
// bitwise rest on those kernels (tests/unit/head_block_products_test.cpp says what, and
// checks it), and a platform may set variables that pick others for every process; each test
// main removes them before MKL reads them (at its first call), so `ctest` alone runs the suite
// as intended on any machine.
#pragma once
#include <cstdlib>

namespace retort::test {

inline void use_blas_own_kernels() {
  for (const char* variable : {"MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE"})
    unsetenv(variable);
}

}  // namespace retort::test
