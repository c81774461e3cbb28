// tests/unit/torch_tests_main.cpp: GoogleTest main of the torch unit tests. The BLAS runs on
// whatever kernels the machine and its settings give it: no test rests on its choice.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
