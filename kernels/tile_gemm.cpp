// kernels/tile_gemm.cpp: see tile_gemm.h. A register block is MR rows x one 32-column panel
// (two zmm per row): per step p it loads the panel's two vectors and broadcasts MR values of
// A, 2 MR fused multiply-adds; MR = 12 keeps 24 accumulators in the 32 zmm registers. Partial
// blocks (fewer rows, a last panel under 32 columns) use smaller MR instantiations and masked
// stores; whole panels store unmasked. A's rows (and C's) are addressed from one base pointer
// per three rows (base, base + a_row, base + 2 a_row are x86 scaled-index addresses), so the
// loop's pointers fit the general registers: with one pointer per row GCC kept two of the
// twelve on the stack and reloaded them every step (docs/benchmark_log.md has the
// measurement). The epilogue can also keep each row's running maximum
// (tile_gemm_row_max), which spares the online softmax a pass over the scores.
#include "kernels/tile_gemm.h"

#include <algorithm>
#include <atomic>

#include "kernels/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RETORT_TILE_GEMM 1
#endif

namespace retort::kernels {

int64_t panel_elements(int64_t k, int64_t n) {
  return k * ((n + kPanelColumns - 1) / kPanelColumns) * kPanelColumns;
}

namespace {

// The transposed pack reads X's rows one after another, kilobytes apart (the packed q|k|v rows
// are 6 KB apart), a stride the hardware prefetchers do not follow, so each row's first touch
// waited on memory: it ran at 2 GB/s. Requesting the row kRowsAhead further on takes it to
// about 5 (measured on one head of s = 2048, d = 64).
constexpr int64_t kRowsAhead = 16;

// Asks for the cache lines of `count` contiguous floats at x.
void prefetch_row(const float* x, int64_t count) {
  for (int64_t i = 0; i < count; i += 64 / int64_t(sizeof(float))) __builtin_prefetch(x + i);
}

}  // namespace

#ifdef RETORT_TILE_GEMM
// GCC 12's shuffle intrinsics fill unused lanes from _mm512_undefined_ps(), which -Wall then
// reports as uninitialised wherever they are inlined; no lane of it is ever read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

// Transposes the 16 x 16 floats in r (row i in r[i]) in place: 64 shuffles, against 256
// scalar loads and stores.
__attribute__((target("avx512f"), always_inline)) inline void transpose_16x16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved by element
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // then by pairs of elements: 4 x 4 blocks in each 128-bit lane
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]),
                  c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int j = 0; j < 4; ++j) {  // then the 128-bit lanes, in two rounds
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
}

// One whole panel of B = X^T: panel[p * 32 + c] = x[(c0 + c) * ld + p] for the panel's 32 rows
// of X, in 16 x 16 blocks for p < k rounded down to 16, one value at a time past that. Twice
// as fast as the scalar loop with the rows in cache (8 heads of K^T, s = 2048: 0.41 -> 0.20
// ms).
__attribute__((target("avx512f"))) void pack_transposed_panel(const float* x, int64_t ld, int64_t k,
                                                              float* panel) {
  for (int64_t half = 0; half < kPanelColumns; half += 16) {
    const float* rows = x + half * ld;
    int64_t p0 = 0;
    for (; p0 + 16 <= k; p0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows + i * ld + p0);
      transpose_16x16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(panel + (p0 + i) * kPanelColumns + half, r[i]);
    }
    for (int64_t c = 0; c < 16; ++c)
      for (int64_t p = p0; p < k; ++p) panel[p * kPanelColumns + half + c] = rows[c * ld + p];
  }
}

}  // namespace
#pragma GCC diagnostic pop
#endif

Panels pack_panels(const float* b, int64_t b_row, int64_t b_col, int64_t k, int64_t n, float* out) {
  const int64_t stride = kPanelColumns * k;
  for (int64_t c0 = 0; c0 < n; c0 += kPanelColumns) {
    float* panel = out + (c0 / kPanelColumns) * stride;
    const int64_t width = std::min(kPanelColumns, n - c0);
    if (b_col == 1) {  // rows of B are contiguous: copy row pieces
      for (int64_t p = 0; p < k; ++p) {
        std::copy(b + p * b_row + c0, b + p * b_row + c0 + width, panel + p * kPanelColumns);
        std::fill(panel + p * kPanelColumns + width, panel + (p + 1) * kPanelColumns, 0.0f);
      }
    } else {  // B = X^T with X given by rows: each X row fills one panel column
#ifdef RETORT_TILE_GEMM
      if (b_row == 1 && width == kPanelColumns && tile_gemm_available()) {
        // The next panel's rows while this one is transposed.
        for (int64_t c = c0 + kPanelColumns; c < std::min(n, c0 + 2 * kPanelColumns); ++c)
          prefetch_row(b + c * b_col, k);
        pack_transposed_panel(b + c0 * b_col, b_col, k, panel);
        continue;
      }
#endif
      if (width < kPanelColumns) std::fill(panel, panel + stride, 0.0f);
      for (int64_t c = 0; c < width; ++c) {
        const float* x = b + (c0 + c) * b_col;
        if (b_row == 1 && c0 + c + kRowsAhead < n) prefetch_row(x + kRowsAhead * b_col, k);
        for (int64_t p = 0; p < k; ++p) panel[p * kPanelColumns + c] = x[p * b_row];
      }
    }
  }
  return {out, stride};
}

namespace {

// The products as plain loops: the form without AVX-512 (the callers use the BLAS there).
void plain_tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                     int64_t a_col, Panels b, bool accumulate, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += a[i * a_row + p * a_col] *
               b.data[(j / kPanelColumns) * b.panel_stride + p * kPanelColumns + j % kPanelColumns];
      c[i * ldc + j] = alpha * sum + (accumulate ? c[i * ldc + j] : 0.0f);
    }
}

void plain_tile_gemm_row_max(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                             int64_t a_row, int64_t a_col, Panels b, float* c, int64_t ldc,
                             float* row_max) {
  plain_tile_gemm(m, n, k, alpha, a, a_row, a_col, b, false, c, ldc);
  for (int64_t i = 0; i < m; ++i) {
    row_max[i] = -__builtin_inff();
    for (int64_t j = 0; j < n; ++j)
      row_max[i] = c[i * ldc + j] > row_max[i] ? c[i * ldc + j] : row_max[i];
  }
}

}  // namespace

#ifdef RETORT_TILE_GEMM
namespace {

constexpr int kRows = 12;

// Asks for the lines of C's next register block (kRows rows, one panel wide) while this block
// runs: the products that add into C (dK and dV over a key tile, whose rows are not in cache
// when their block starts) otherwise waited on them in the epilogue; 5-6% on those two
// products (one head, s = 2048). A no-op for a null c_next.
__attribute__((target("avx512f"), always_inline)) inline void prefetch_block(const float* c_next,
                                                                             int64_t ldc) {
  if (!c_next) return;
#pragma GCC unroll 12
  for (int i = 0; i < kRows; ++i) {
    __builtin_prefetch(c_next + i * ldc, 1);
    __builtin_prefetch(c_next + i * ldc + 16, 1);
  }
}

// What a register block does with its sums S: C = alpha S (+ C when `accumulate`); with
// `row_max` set, also raises row i's 16 lanes at row_max + 16 i to its values of alpha S.
// Pointers are those of the block's first row.
struct Epilogue {
  float alpha = 1;
  bool accumulate = false;
  float* row_max = nullptr;
  // The same for the block starting at row i.
  Epilogue from_row(int64_t i) const {
    return {alpha, accumulate, row_max ? row_max + i * 16 : nullptr};
  }
};

template <int MR>
__attribute__((target("avx512f"), always_inline)) inline void block(
    int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, __mmask16 m0,
    __mmask16 m1, const Epilogue& e, float* c, int64_t ldc, const float* c_next = nullptr) {
  prefetch_block(c_next, ldc);
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    acc0[i] = _mm512_setzero_ps();
    acc1[i] = _mm512_setzero_ps();
  }
  constexpr int kBases = (MR + 2) / 3;
  const float* base[kBases];
#pragma GCC unroll 4
  for (int g = 0; g < kBases; ++g) base[g] = a + 3 * g * a_row;
  for (int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_loadu_ps(b);
    const __m512 b1 = _mm512_loadu_ps(b + 16);
    b += kPanelColumns;
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(base[i / 3][(i % 3) * a_row]);
      acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < kBases; ++g) base[g] += a_col;
  }
  const __m512 scale = _mm512_set1_ps(e.alpha);
  const bool whole = m0 == 0xffff && m1 == 0xffff;
  float* cbase[kBases];
#pragma GCC unroll 4
  for (int g = 0; g < kBases; ++g) cbase[g] = c + 3 * g * ldc;
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    float* ci = cbase[i / 3] + (i % 3) * ldc;
    __m512 r0 = _mm512_mul_ps(scale, acc0[i]), r1 = _mm512_mul_ps(scale, acc1[i]);
    if (e.row_max) {
      // r first: vmaxps returns its second operand when either is NaN, so NaN is skipped
      // (lanes past C's last column count as -inf)
      float* lanes = e.row_max + i * 16;
      const __m512 none = _mm512_set1_ps(-__builtin_inff());
      const __m512 v0 = whole ? r0 : _mm512_mask_mov_ps(none, m0, r0);
      const __m512 v1 = whole ? r1 : _mm512_mask_mov_ps(none, m1, r1);
      _mm512_storeu_ps(lanes, _mm512_max_ps(v1, _mm512_max_ps(v0, _mm512_loadu_ps(lanes))));
    }
    if (whole) {
      if (e.accumulate) {
        r0 = _mm512_add_ps(r0, _mm512_loadu_ps(ci));
        r1 = _mm512_add_ps(r1, _mm512_loadu_ps(ci + 16));
      }
      _mm512_storeu_ps(ci, r0);
      _mm512_storeu_ps(ci + 16, r1);
    } else {
      if (e.accumulate) {
        r0 = _mm512_add_ps(r0, _mm512_maskz_loadu_ps(m0, ci));
        r1 = _mm512_add_ps(r1, _mm512_maskz_loadu_ps(m1, ci + 16));
      }
      _mm512_mask_storeu_ps(ci, m0, r0);
      _mm512_mask_storeu_ps(ci + 16, m1, r1);
    }
  }
}

// The rows below a multiple of kRows: one block of 1..11 rows.
template <int MR = kRows - 1>
__attribute__((target("avx512f"))) void tail_block(int rows, int64_t k, const float* a,
                                                   int64_t a_row, int64_t a_col, const float* b,
                                                   __mmask16 m0, __mmask16 m1, const Epilogue& e,
                                                   float* c, int64_t ldc) {
  if constexpr (MR > 0) {
    if (rows == MR) return block<MR>(k, a, a_row, a_col, b, m0, m1, e, c, ldc);
    tail_block<MR - 1>(rows, k, a, a_row, a_col, b, m0, m1, e, c, ldc);
  }
}

// row_max[i] = the largest of lanes[16 i .. 16 i + 15], i < m.
__attribute__((target("avx512f"))) void reduce_lanes(int64_t m, const float* lanes,
                                                     float* row_max) {
  for (int64_t i = 0; i < m; ++i)
    row_max[i] = _mm512_reduce_max_ps(_mm512_loadu_ps(lanes + 16 * i));
}

__mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

__attribute__((target("avx512f"))) void tile_gemm_avx512(int64_t m, int64_t n, int64_t k,
                                                         const float* a, int64_t a_row,
                                                         int64_t a_col, Panels b, const Epilogue& e,
                                                         float* c, int64_t ldc) {
  // Panels outer: one panel (k x 128 bytes) stays in L1 for all row blocks.
  for (int64_t j = 0; j < n; j += kPanelColumns) {
    const __mmask16 m0 = lanes(n - j), m1 = lanes(n - j - 16);
    const float* panel = b.data + (j / kPanelColumns) * b.panel_stride;
    int64_t i = 0;
    for (; i + kRows <= m; i += kRows) {
      // C's next block: the next rows of this panel, or the first rows of the next panel.
      const float* c_next = !e.accumulate                         ? nullptr
                            : i + 2 * kRows <= m                  ? c + (i + kRows) * ldc + j
                            : j + kPanelColumns < n && kRows <= m ? c + j + kPanelColumns
                                                                  : nullptr;
      block<kRows>(k, a + i * a_row, a_row, a_col, panel, m0, m1, e.from_row(i), c + i * ldc + j,
                   ldc, c_next);
    }
    if (i < m)
      tail_block(int(m - i), k, a + i * a_row, a_row, a_col, panel, m0, m1, e.from_row(i),
                 c + i * ldc + j, ldc);
  }
}

}  // namespace

namespace {
std::atomic<bool> enabled{true};
}  // namespace

void set_tile_gemm_enabled(bool on) {
  enabled = on;
}

bool tile_gemm_available() {
  return kernel_isa() == Isa::avx512 && enabled;
}

void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
               int64_t a_col, Panels b, bool accumulate, float* c, int64_t ldc) {
  // Guarded here too: a caller that skipped tile_gemm_available() gets the plain loops, not
  // an illegal instruction.
  if (kernel_isa() != Isa::avx512)
    return plain_tile_gemm(m, n, k, alpha, a, a_row, a_col, b, accumulate, c, ldc);
  tile_gemm_avx512(m, n, k, a, a_row, a_col, b, {alpha, accumulate}, c, ldc);
}

void tile_gemm_row_max(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                       int64_t a_col, Panels b, float* c, int64_t ldc, float* row_max,
                       float* lanes) {
  if (kernel_isa() != Isa::avx512)
    return plain_tile_gemm_row_max(m, n, k, alpha, a, a_row, a_col, b, c, ldc, row_max);
  std::fill(lanes, lanes + 16 * m, -__builtin_inff());
  tile_gemm_avx512(m, n, k, a, a_row, a_col, b, {alpha, false, lanes}, c, ldc);
  reduce_lanes(m, lanes, row_max);
}
#else
void set_tile_gemm_enabled(bool) {}
bool tile_gemm_available() {
  return false;
}

void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
               int64_t a_col, Panels b, bool accumulate, float* c, int64_t ldc) {
  plain_tile_gemm(m, n, k, alpha, a, a_row, a_col, b, accumulate, c, ldc);
}

void tile_gemm_row_max(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                       int64_t a_col, Panels b, float* c, int64_t ldc, float* row_max, float*) {
  plain_tile_gemm_row_max(m, n, k, alpha, a, a_row, a_col, b, c, ldc, row_max);
}
#endif

}  // namespace retort::kernels
