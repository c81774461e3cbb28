// layers/blocked_product.cpp: see blocked_product.h.
#include "layers/blocked_product.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "layers/tile_gemm.h"

namespace retort::layers {

namespace kernels = retort::layers::kernels;

void blocked_product(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                     const float* b, int64_t b_row, int64_t b_col, bool accumulate, float* c,
                     int64_t ldc) {
  const int64_t panels = (n + kernels::kPanelColumns - 1) / kernels::kPanelColumns;
  at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
    thread_local std::vector<float> chunk;
    chunk.resize(size_t(kernels::kPanelColumns * kBlockInner));
    for (int64_t i0 = 0; i0 < m; i0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, m - i0);
      for (int64_t p0 = 0; p0 < k; p0 += kBlockInner) {
        const int64_t inner = std::min(kBlockInner, k - p0);
        // The first chunk writes C unless asked to add; every later chunk adds to it.
        const bool add = accumulate || p0 > 0;
        const float* a_block = a + i0 * a_row + p0 * a_col;
        for (int64_t j = first; j < last; ++j) {
          const int64_t c0 = j * kernels::kPanelColumns;
          const int64_t width = std::min(kernels::kPanelColumns, n - c0);
          const kernels::Panels packed = kernels::pack_panels(b + p0 * b_row + c0 * b_col, b_row,
                                                              b_col, inner, width, chunk.data());
          kernels::tile_gemm(rows, width, inner, 1.0f, a_block, a_row, a_col, packed, add,
                             c + i0 * ldc + c0, ldc);
        }
      }
    }
  });
}

}  // namespace retort::layers
