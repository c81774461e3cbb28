// tests/unit/avx512_exp_test.cpp: the attention softmax's AVX-512 exp rows
// (kernels/avx512_exp.h) against exp in double: accuracy over the whole range the softmax
// feeds them, the clamp below -87, the running sum, and rows of every length around the 16-
// and 64-value steps, with the values past a row's end left untouched.
#include "kernels/avx512_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu_features.h"

#ifdef RETORT_AVX512_EXP
namespace {

using retort::kernels::exp_shifted_avx512;

__attribute__((target("avx512f"))) float exp_row(float* x, int64_t n, float shift, bool sum) {
  return sum ? exp_shifted_avx512<true>(x, n, shift) : exp_shifted_avx512<false>(x, n, shift);
}

bool has_avx512() {
  return retort::kernels::kernel_isa() == retort::kernels::Isa::avx512;
}

// Relative error in units of 2^-24 (half an ulp at the bottom of a binade).
double error_units(float got, double want) {
  return std::fabs(double(got) - want) / want * std::ldexp(1.0, 24);
}

// What the row should hold: exp of x - shift as rounded to fp32, the argument the kernel (and
// the softmax it serves) has; the rounding of the difference itself is the caller's.
double exact_exp(float x, float shift) {
  return std::exp(double(x - shift));
}

TEST(Avx512Exp, WithinTwoUlpOverTheSoftmaxRange) {
  if (!has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  // x - shift over [-87, 8] in steps that hit every reduction interval many times.
  const float shift = 3.25f;
  std::vector<float> x, want;
  for (double t = -87.0; t <= 8.0; t += 0.000731) {
    x.push_back(float(t + shift));
    want.push_back(exact_exp(x.back(), shift));
  }
  double worst = 0;
  exp_row(x.data(), int64_t(x.size()), shift, false);
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, error_units(x[i], want[i]));
  // Two ulp, as kernels/vector_exp.h's Cephes form.
  EXPECT_LE(worst, 4.0);
}

TEST(Avx512Exp, ClampsFarBelowToExpOfMinus87) {
  if (!has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  // Far below -87: e^-87 (a normal float), never 0 or a denormal; as kernels/vector_exp.h.
  std::vector<float> x = {-87.5f, -100.0f, -1e4f, -3e38f, -87.0f};
  exp_row(x.data(), int64_t(x.size()), 0.0f, false);
  for (float value : x) {
    EXPECT_TRUE(std::isnormal(value)) << value;
    EXPECT_LE(error_units(value, std::exp(-87.0)), 4.0) << value;
  }
}

TEST(Avx512Exp, RowsOfEveryLengthSumAndStopAtTheirEnd) {
  if (!has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  const float sentinel = 12345.0f;
  for (int64_t n : {1, 7, 15, 16, 17, 48, 63, 64, 65, 79, 128, 131, 200}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    std::vector<float> x(n + 40, sentinel);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = float(-0.37 * double(i % 23) + 0.11 * double(i % 5));
      want_sum += exact_exp(x[i], 0.5f);
    }
    const std::vector<float> before = x;
    const float sum = exp_row(x.data(), n, 0.5f, true);
    EXPECT_LE(std::fabs(sum - want_sum) / want_sum, 1e-6);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_LE(error_units(x[i], exact_exp(before[i], 0.5f)), 4.0) << i;
    for (int64_t i = n; i < int64_t(x.size()); ++i) ASSERT_EQ(x[i], sentinel) << i;
  }
}

}  // namespace
#endif
