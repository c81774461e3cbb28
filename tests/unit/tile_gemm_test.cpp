// tests/unit/tile_gemm_test.cpp: the attention's AVX-512 tile products (kernels/tile_gemm.h)
// against a float64 triple loop: shapes with partial row blocks and partial panels, A read
// in place or transposed, B packed from rows or from the rows of X (B = X^T), a nonzero
// alpha, and accumulation into an existing C; the row maxima tile_gemm_row_max forms in
// registers against the maxima of the C it writes.
#include "kernels/tile_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace retort::kernels {
namespace {

struct Case {
  int64_t m, n, k;
  bool trans_a, b_from_x, accumulate;
};

void check(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << "m " << c.m << " n " << c.n << " k " << c.k << " trans_a " << c.trans_a
               << " b_from_x " << c.b_from_x << " accumulate " << c.accumulate);
  std::normal_distribution<float> normal;
  const int64_t lda = (c.trans_a ? c.m : c.k) + 3, ldb = (c.b_from_x ? c.k : c.n) + 5,
                ldc = c.n + 2;
  // A stored [m, k] (or [k, m] when read transposed); B [k, n] (or X [n, k], B = X^T).
  std::vector<float> a((c.trans_a ? c.k : c.m) * lda), b((c.b_from_x ? c.n : c.k) * ldb),
      out(c.m * ldc);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  for (float& x : out) x = normal(rng);
  const std::vector<float> before = out;
  auto a_at = [&](int64_t i, int64_t p) { return c.trans_a ? a[p * lda + i] : a[i * lda + p]; };
  auto b_at = [&](int64_t p, int64_t j) { return c.b_from_x ? b[j * ldb + p] : b[p * ldb + j]; };

  std::vector<float> packed(panel_elements(c.k, c.n), std::nanf(""));
  const Panels panels = c.b_from_x ? pack_panels(b.data(), 1, ldb, c.k, c.n, packed.data())
                                   : pack_panels(b.data(), ldb, 1, c.k, c.n, packed.data());
  const float alpha = 0.75f;
  tile_gemm(c.m, c.n, c.k, alpha, a.data(), c.trans_a ? 1 : lda, c.trans_a ? lda : 1, panels,
            c.accumulate, out.data(), ldc);

  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      if (j >= c.n) {  // past the product's columns nothing is written
        ASSERT_EQ(out[i * ldc + j], before[i * ldc + j]) << "row " << i << " column " << j;
        continue;
      }
      double sum = 0, magnitude = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        sum += double(a_at(i, p)) * double(b_at(p, j));
        magnitude += std::fabs(double(a_at(i, p)) * double(b_at(p, j)));
      }
      const double expected = alpha * sum + (c.accumulate ? before[i * ldc + j] : 0.0);
      // fp32 products summed in fp32: error bounded by k ulps of the terms' magnitude.
      ASSERT_NEAR(out[i * ldc + j], expected, 1e-6 * c.k * (magnitude + 1))
          << "row " << i << " column " << j;
    }
  }
}

TEST(TileGemm, MatchesFloat64Reference) {
  std::mt19937 rng(11);
  for (bool trans_a : {false, true})
    for (bool b_from_x : {false, true})
      for (bool accumulate : {false, true}) {
        check({24, 64, 64, trans_a, b_from_x, accumulate}, rng);  // whole blocks and panels
        check({37, 45, 19, trans_a, b_from_x, accumulate}, rng);  // partial rows and panels
        check({13, 50, 8, trans_a, b_from_x, accumulate}, rng);   // a panel's second half partial
        check({5, 7, 3, trans_a, b_from_x, accumulate}, rng);     // less than one of each
        check({128, 96, 130, trans_a, b_from_x, accumulate}, rng);
      }
}

TEST(TileGemm, PanelsZeroPastTheLastColumn) {
  // The last panel's missing columns are zero, so a product over them adds nothing.
  const int64_t k = 3, n = 40;
  std::vector<float> b(k * n, 1.0f), packed(panel_elements(k, n), std::nanf(""));
  const Panels panels = pack_panels(b.data(), n, 1, k, n, packed.data());
  ASSERT_EQ(int64_t(packed.size()), k * 64);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t c = n; c < 64; ++c)
      EXPECT_EQ(panels.data[panels.panel_stride + p * kPanelColumns + c % kPanelColumns], 0.0f);
}

// tile_gemm_row_max over C = alpha A B with every value below -50 (so a lane past the last
// column counted as 0, not -inf, would show) and, when `with_nan`, a NaN column (skipped, as
// the softmax's max_of skips it). C must equal tile_gemm's, row_max each row's largest value.
void check_row_max(int64_t m, int64_t n, int64_t k, bool with_nan, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << "m " << m << " n " << n << " k " << k << " nan " << with_nan);
  std::uniform_real_distribution<float> uniform(1.0f, 2.0f);
  const int64_t lda = k + 1, ldb = n + 3, ldc = n + 5;
  std::vector<float> a(m * lda), b(k * ldb);
  for (float& x : a) x = uniform(rng);
  for (float& x : b) x = uniform(rng);
  if (with_nan) b[n / 2] = std::nanf("");  // column n / 2 of every row of C
  std::vector<float> packed(panel_elements(k, n));
  const Panels panels = pack_panels(b.data(), ldb, 1, k, n, packed.data());
  const float alpha = -50.0f;
  std::vector<float> expected(m * ldc, 7.0f), out(m * ldc, 7.0f), row_max(m, 7.0f),
      lanes(16 * m, 7.0f);
  tile_gemm(m, n, k, alpha, a.data(), lda, 1, panels, false, expected.data(), ldc);
  tile_gemm_row_max(m, n, k, alpha, a.data(), lda, 1, panels, out.data(), ldc, row_max.data(),
                    lanes.data());
  for (int64_t i = 0; i < m; ++i) {
    float largest = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < ldc; ++j) {
      const float want = expected[i * ldc + j], got = out[i * ldc + j];
      ASSERT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
          << "row " << i << " column " << j << ": " << got << " against " << want;
      if (j < n && !std::isnan(want)) largest = std::max(largest, want);
    }
    ASSERT_LT(largest, -50.0f);
    ASSERT_EQ(row_max[i], largest) << "row " << i;
  }
}

TEST(TileGemm, RowMaximaMatchTheProductsRows) {
  std::mt19937 rng(5);
  for (bool with_nan : {false, true}) {
    check_row_max(24, 64, 64, with_nan, rng);    // whole blocks and panels
    check_row_max(37, 45, 19, with_nan, rng);    // partial rows and panels
    check_row_max(13, 50, 8, with_nan, rng);     // a panel's second half partial
    check_row_max(5, 7, 3, with_nan, rng);       // less than one of each
    check_row_max(128, 512, 64, with_nan, rng);  // the attention's tile
  }
}

}  // namespace
}  // namespace retort::kernels
