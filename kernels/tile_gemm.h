// kernels/tile_gemm.h: the small fp32 matrix products of the fused attention (a query block
// against a key tile, head dimension 64 or so) as AVX-512 register-blocked loops. B is read
// from panels of 32 columns packed once per head (pack_panels), so every load is sequential
// whatever the source's row stride: the packed q|k|v rows are 6 KB apart, which maps a tile's
// rows onto a few L1 sets. A is read in place through two strides, so A and A^T cost the
// same. Without AVX-512 the same products run as plain loops (callers use the BLAS there).
#pragma once
#include <cstdint>

namespace retort::kernels {

constexpr int64_t kPanelColumns = 32;

// Whether this CPU runs tile_gemm's AVX-512 loops (and they are enabled).
bool tile_gemm_available();

// Process-wide, default on: off sends the attention's products to the BLAS, so benchmarks and
// tests can run both forms in one process.
void set_tile_gemm_enabled(bool on);

// A matrix B [k, n] in panels: element (p, c) at
// panels[(c / 32) * panel_stride + p * 32 + c % 32], panel_stride >= 32 * rows packed.
struct Panels {
  const float* data;
  int64_t panel_stride;
  // The rows [p0, ...) of the same matrix.
  Panels rows_from(int64_t p0) const { return {data + p0 * kPanelColumns, panel_stride}; }
  // The columns [c0, ...) (c0 a multiple of 32).
  Panels columns_from(int64_t c0) const {
    return {data + (c0 / kPanelColumns) * panel_stride, panel_stride};
  }
};

// Packs B [k, n] into `out` (k * round_up(n, 32) values; columns past n are zero) as Panels
// with panel_stride 32 k. B element (p, c) is at b[p * b_row + c * b_col]: (ld, 1) for B
// given by rows, (1, ld) for B = X^T with X given by rows (whole panels of that form by 16 x 16
// register transposes on AVX-512 CPUs).
Panels pack_panels(const float* b, int64_t b_row, int64_t b_col, int64_t k, int64_t n, float* out);

// Values pack_panels writes for k x n.
int64_t panel_elements(int64_t k, int64_t n);

// C[m, n] = alpha * A B (+ C if accumulate), A element (i, p) at a[i * a_row + p * a_col],
// C row i at c + i * ldc.
void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
               int64_t a_col, Panels b, bool accumulate, float* c, int64_t ldc);

// tile_gemm's C = alpha A B that also gives row_max[i], the largest value of C's row i (NaN
// skipped), from the product's registers instead of a pass over C: the online softmax's row
// maximum. lanes: 16 m values of workspace.
void tile_gemm_row_max(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                       int64_t a_col, Panels b, float* c, int64_t ldc, float* row_max,
                       float* lanes);

}  // namespace retort::kernels
