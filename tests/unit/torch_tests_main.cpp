// tests/unit/torch_tests_main.cpp: GoogleTest main of the torch unit tests: MKL on its own
// kernels (tests/support/blas_own_kernels.h), then every test.
#include <gtest/gtest.h>

#include "tests/support/blas_own_kernels.h"

int main(int argc, char** argv) {
  retort::test::use_blas_own_kernels();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
