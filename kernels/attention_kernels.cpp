// kernels/attention_kernels.cpp: see attention_kernels.h. The per-tile passes are per-ISA
// wrappers around always-inline templates (kernels/isa_variants.h), built with -fopenmp-simd
// and -fno-trapping-math like the other kernel loops. Within a query block, row t meets the
// keys [max(0, t - window + 1), t]; a tile's columns outside that range get probability 0
// explicitly, so no -inf ever enters an exp.
#include "kernels/attention_kernels.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>

#include "kernels/avx512_exp.h"
#include "kernels/isa_variants.h"
#include "kernels/tile_gemm.h"
#include "kernels/vector_exp.h"
#include "kernels/vector_max.h"

namespace retort::kernels {
namespace {

using retort::kernels::max_of;
using retort::kernels::vector_exp;

// The BLAS's Fortran entry points sgemm_ and dgemm_ (column-major, arguments by address),
// looked up in the BLAS libtorch loads: every BLAS exports them, while the C interface
// (cblas_*) is hidden in the PyPI wheel, which links MKL statically into libtorch_cpu.
using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                         const float*, const int*, const float*, const int*, const float*, float*,
                         const int*);
using DgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*,
                         const double*, const double*, const int*, const double*, const int*,
                         const double*, double*, const int*);

struct Blas {
  SgemmFn sgemm = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "sgemm_"));
  DgemmFn dgemm = reinterpret_cast<DgemmFn>(dlsym(RTLD_DEFAULT, "dgemm_"));
};

const Blas& blas() {
  static const Blas functions;
  return functions;
}

// C[m, n] = alpha * op(A) op(B) + beta * C, row-major, leading dimensions in elements. A
// row-major C is a column-major C^T = op(B)^T op(A)^T, so the Fortran call swaps A and B.
template <typename T, typename Fn>
void column_major_gemm(Fn fn, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                       const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                       int64_t ldc) {
  const char op_b = trans_b ? 'T' : 'N', op_a = trans_a ? 'T' : 'N';
  const int rows = int(n), cols = int(m), inner = int(k);
  const int ld_b = int(ldb), ld_a = int(lda), ld_c = int(ldc);
  fn(&op_b, &op_a, &rows, &cols, &inner, &alpha, b, &ld_b, a, &ld_a, &beta, c, &ld_c);
}
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  column_major_gemm(blas().sgemm, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  column_major_gemm(blas().dgemm, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The tile products: fp32 through tile_gemm where the CPU has AVX-512, with B read from
// panels packed once per head (`panels` non-null); fp64, fp32 elsewhere, and key tiles that
// do not start on a panel through the BLAS.
template <typename T>
bool tile_products() {
  if constexpr (std::is_same_v<T, float>) return tile_gemm_available();
  return false;
}

// The rows [0, s) of X (d values each, row stride ld) as panels of X, or of X^T when
// `transposed`, in `space`, which moves past them.
template <typename T>
Panels pack(const T* x, int64_t ld, int64_t s, int64_t d, bool transposed, T*& space) {
  if constexpr (std::is_same_v<T, float>) {
    const Panels packed =
        transposed ? pack_panels(x, 1, ld, d, s, space) : pack_panels(x, ld, 1, s, d, space);
    space += transposed ? panel_elements(d, s) : panel_elements(s, d);
    return packed;
  }
  return {nullptr, 0};
}

#ifdef RETORT_AVX512_EXP
// write_rows' streaming form: d a multiple of 16, dst and dst_ld on 64-byte lines.
__attribute__((target("avx512f"))) void stream_rows_avx512(int64_t rows, int64_t d, float scale,
                                                           const float* src, int64_t src_ld,
                                                           float* dst, int64_t dst_ld) {
  const __m512 factor = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; j += 16)
      _mm512_stream_ps(dst + r * dst_ld + j,
                       _mm512_mul_ps(factor, _mm512_loadu_ps(src + r * src_ld + j)));
}

// Streaming stores are weakly ordered: this makes the calling thread's visible to the others
// before it reports its work done.
void streamed_rows_visible() {
  _mm_sfence();
}
#else
void streamed_rows_visible() {}
#endif

// dst row i = scale * src row i, rows of d values. Results the caller reads only after every
// head is done (dQ, dK, dV): on the AVX-512 path, fp32 rows of whole 64-byte lines are
// written with streaming stores, which skip reading the destination lines in first and do not
// evict the head's panels and tiles for lines it will not touch again; the writer's
// streamed_rows_visible() orders them before its work is reported done. The backward ran 1.5%
// faster than with plain stores (one thread, s = 2048, 7 of 10 alternations).
template <typename T>
void write_rows(int64_t rows, int64_t d, T scale, const T* src, int64_t src_ld, T* dst,
                int64_t dst_ld) {
#ifdef RETORT_AVX512_EXP
  if constexpr (std::is_same_v<T, float>) {
    if (tile_gemm_available() && d % 16 == 0 && dst_ld % 16 == 0 &&
        reinterpret_cast<uintptr_t>(dst) % 64 == 0)
      return stream_rows_avx512(rows, d, scale, src, src_ld, dst, dst_ld);
  }
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j) dst[r * dst_ld + j] = scale * src[r * src_ld + j];
}

// Asks for the cache lines of `rows` rows of d values (row stride ld) a query block before
// their use. A head's rows are kilobytes apart (the packed q|k|v rows 6 KB, the output and its
// gradient 2 KB), a stride the hardware prefetchers do not follow across pages, so each row's
// first touch waited on memory. With the next block's Q (forward) and Q, dO and O (backward)
// asked for while this block's products run, the layer runs faster (docs/benchmark_log.md).
template <typename T>
void prefetch_rows(const T* x, int64_t ld, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; j += 64 / int64_t(sizeof(T)))
      __builtin_prefetch(x + r * ld + j, 0, 2);
}

// C[m, n] = alpha A X^T over X's rows [x0, x0 + n) (k = d).
template <typename T>
void product_a_xt(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* x,
                  int64_t ldx, int64_t x0, const Panels* xt, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (xt && x0 % kPanelColumns == 0)
      return tile_gemm(m, n, k, alpha, a, lda, 1, xt->columns_from(x0), false, c, ldc);
  }
  gemm(false, true, m, n, k, alpha, a, lda, x + x0 * ldx, ldx, T(0), c, ldc);
}

// C[m, n] += alpha op(A) X over X's rows [x0, x0 + k).
template <typename T>
void product_add(bool trans_a, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                 const T* x, int64_t ldx, int64_t x0, const Panels* xp, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (xp)
      return tile_gemm(m, n, k, alpha, a, trans_a ? 1 : lda, trans_a ? lda : 1, xp->rows_from(x0),
                       true, c, ldc);
  }
  gemm(trans_a, false, m, n, k, alpha, a, lda, x + x0 * ldx, ldx, T(1), c, ldc);
}

// The keys query row t sees, as tile columns [lo, hi) of the tile starting at key k0 with
// `cols` columns (lo >= hi: none).
struct Visible {
  int64_t lo, hi;
};
RETORT_ALWAYS_INLINE Visible visible(int64_t t, int64_t k0, int64_t cols, int64_t window) {
  const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
  return {std::clamp<int64_t>(first - k0, 0, cols), std::clamp<int64_t>(t + 1 - k0, 0, cols)};
}

// The row passes' exp: x becomes exp(x - shift) over n values, exp_shifted_sum returns the sum
// of the new values. As loops the compiler vectorises in each SIMD clone.
struct PortableRows {
  template <typename T>
  RETORT_ALWAYS_INLINE T exp_shifted_sum(T* __restrict x, int64_t n, T shift) const {
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      const T p = vector_exp(x[j] - shift);
      x[j] = p;
      sum += p;
    }
    return sum;
  }
  template <typename T>
  RETORT_ALWAYS_INLINE void exp_shifted(T* __restrict x, int64_t n, T shift) const {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) x[j] = vector_exp(x[j] - shift);
  }
};

#ifdef RETORT_AVX512_EXP
// The same in AVX-512 intrinsics (fp32): four exps side by side and 2^n by vscalefps. The
// vectorised vector_exp is a single dependent chain per vector with integer conversions,
// which kept the forward's online softmax waiting on latency.
struct Avx512Rows {
  // Out of line (a call per row): inlined, GCC may meet them first inside the tile templates,
  // which are not compiled for AVX-512.
  __attribute__((target("avx512f"), noinline)) float exp_shifted_sum(float* x, int64_t n,
                                                                     float shift) const {
    return retort::kernels::exp_shifted_avx512<true>(x, n, shift);
  }
  __attribute__((target("avx512f"), noinline)) void exp_shifted(float* x, int64_t n,
                                                                float shift) const {
    retort::kernels::exp_shifted_avx512<false>(x, n, shift);
  }
};
#endif

// Online softmax over one tile of scores s [rows, ld] (scaled), in place: per row the running
// max m and sum l are updated, the accumulated output acc [rows, d] rescaled, and s becomes
// exp(s - m) on the visible columns, 0 elsewhere. known_max: each row's maximum over the tile
// when the caller has it (every column visible to every row), else null: found here.
template <typename T, typename Rows = PortableRows>
RETORT_ALWAYS_INLINE void online_softmax_tile(T* s, int64_t ld, int64_t rows, int64_t cols,
                                              int64_t q0, int64_t k0, int64_t window, T* m, T* l,
                                              T* acc, int64_t d, const T* known_max,
                                              const Rows& exp_rows = Rows{}) {
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict row = s + r * ld;
    const Visible v = visible(q0 + r, k0, cols, window);
    if (v.lo >= v.hi) {
      std::fill(row, row + cols, T(0));
      continue;
    }
    const T m_new = std::max(m[r], known_max ? known_max[r] : max_of(row + v.lo, v.hi - v.lo));
    std::fill(row, row + v.lo, T(0));
    const T sum = exp_rows.exp_shifted_sum(row + v.lo, v.hi - v.lo, m_new);
    std::fill(row + v.hi, row + cols, T(0));
    if (m[r] == -std::numeric_limits<T>::infinity()) {
      l[r] = sum;
    } else if (m_new != m[r]) {
      const T correction = vector_exp(m[r] - m_new);
      l[r] = l[r] * correction + sum;
      T* __restrict a = acc + r * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) a[j] *= correction;
    } else {
      l[r] += sum;
    }
    m[r] = m_new;
  }
}

// Backward: s [rows, ld] (scaled scores) becomes the probabilities exp(s - lse) on the
// visible columns, 0 elsewhere.
template <typename T, typename Rows = PortableRows>
RETORT_ALWAYS_INLINE void probabilities_tile(T* s, int64_t ld, int64_t rows, int64_t cols,
                                             int64_t q0, int64_t k0, int64_t window, const T* lse,
                                             const Rows& exp_rows = Rows{}) {
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict row = s + r * ld;
    const Visible v = visible(q0 + r, k0, cols, window);
    const int64_t lo = std::min(v.lo, v.hi);
    std::fill(row, row + lo, T(0));
    exp_rows.exp_shifted(row + lo, v.hi - lo, lse[r]);
    std::fill(row + std::max(lo, v.hi), row + cols, T(0));
  }
}

// dp [rows, ld] (dO V^T) becomes dS = p * (dp - row_dot) in place.
template <typename T>
RETORT_ALWAYS_INLINE void score_gradient_tile(T* dp, const T* p, int64_t ld, int64_t rows,
                                              int64_t cols, const T* row_dot) {
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict g = dp + r * ld;
    const T* __restrict pr = p + r * ld;
    const T dot = row_dot[r];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) g[j] = pr[j] * (g[j] - dot);
  }
}

// out[r] = sum_j a[r, j] b[r, j] over d columns.
template <typename T>
RETORT_ALWAYS_INLINE void row_dots(const T* a, int64_t lda, const T* b, int64_t ldb, int64_t rows,
                                   int64_t d, T* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* __restrict ar = a + r * lda;
    const T* __restrict br = b + r * ldb;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < d; ++j) sum += ar[j] * br[j];
    out[r] = sum;
  }
}

RETORT_ISA_VARIANTS(online_softmax,
                    (float* s, int64_t ld, int64_t rows, int64_t cols, int64_t q0, int64_t k0,
                     int64_t window, float* m, float* l, float* acc, int64_t d,
                     const float* known_max),
                    (s, ld, rows, cols, q0, k0, window, m, l, acc, d, known_max),
                    online_softmax_tile)
RETORT_ISA_VARIANTS(online_softmax,
                    (double* s, int64_t ld, int64_t rows, int64_t cols, int64_t q0, int64_t k0,
                     int64_t window, double* m, double* l, double* acc, int64_t d,
                     const double* known_max),
                    (s, ld, rows, cols, q0, k0, window, m, l, acc, d, known_max),
                    online_softmax_tile)
RETORT_ISA_VARIANTS(probabilities,
                    (float* s, int64_t ld, int64_t rows, int64_t cols, int64_t q0, int64_t k0,
                     int64_t window, const float* lse),
                    (s, ld, rows, cols, q0, k0, window, lse), probabilities_tile)
RETORT_ISA_VARIANTS(probabilities,
                    (double* s, int64_t ld, int64_t rows, int64_t cols, int64_t q0, int64_t k0,
                     int64_t window, const double* lse),
                    (s, ld, rows, cols, q0, k0, window, lse), probabilities_tile)
#ifdef RETORT_AVX512_EXP
__attribute__((target("avx512f"))) void online_softmax_avx512(float* s, int64_t ld, int64_t rows,
                                                              int64_t cols, int64_t q0, int64_t k0,
                                                              int64_t window, float* m, float* l,
                                                              float* acc, int64_t d,
                                                              const float* known_max) {
  online_softmax_tile(s, ld, rows, cols, q0, k0, window, m, l, acc, d, known_max, Avx512Rows{});
}
__attribute__((target("avx512f"))) void probabilities_avx512(float* s, int64_t ld, int64_t rows,
                                                             int64_t cols, int64_t q0, int64_t k0,
                                                             int64_t window, const float* lse) {
  probabilities_tile(s, ld, rows, cols, q0, k0, window, lse, Avx512Rows{});
}
#endif

// The softmax passes on the AVX-512 path where the tile products take it (fp32, AVX-512).
template <typename T>
void online_softmax_pass(bool avx512, T* s, int64_t ld, int64_t rows, int64_t cols, int64_t q0,
                         int64_t k0, int64_t window, T* m, T* l, T* acc, int64_t d,
                         const T* known_max) {
#ifdef RETORT_AVX512_EXP
  if constexpr (std::is_same_v<T, float>) {
    if (avx512)
      return online_softmax_avx512(s, ld, rows, cols, q0, k0, window, m, l, acc, d, known_max);
  }
#endif
  online_softmax(s, ld, rows, cols, q0, k0, window, m, l, acc, d, known_max);
}
template <typename T>
void probabilities_pass(bool avx512, T* s, int64_t ld, int64_t rows, int64_t cols, int64_t q0,
                        int64_t k0, int64_t window, const T* lse) {
#ifdef RETORT_AVX512_EXP
  if constexpr (std::is_same_v<T, float>) {
    if (avx512) return probabilities_avx512(s, ld, rows, cols, q0, k0, window, lse);
  }
#endif
  probabilities(s, ld, rows, cols, q0, k0, window, lse);
}

RETORT_ISA_VARIANTS(score_gradient,
                    (float* dp, const float* p, int64_t ld, int64_t rows, int64_t cols,
                     const float* row_dot),
                    (dp, p, ld, rows, cols, row_dot), score_gradient_tile)
RETORT_ISA_VARIANTS(score_gradient,
                    (double* dp, const double* p, int64_t ld, int64_t rows, int64_t cols,
                     const double* row_dot),
                    (dp, p, ld, rows, cols, row_dot), score_gradient_tile)
RETORT_ISA_VARIANTS(dots,
                    (const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows,
                     int64_t d, float* out),
                    (a, lda, b, ldb, rows, d, out), row_dots)
RETORT_ISA_VARIANTS(dots,
                    (const double* a, int64_t lda, const double* b, int64_t ldb, int64_t rows,
                     int64_t d, double* out),
                    (a, lda, b, ldb, rows, d, out), row_dots)

// The keys query rows [q0, q0 + rows) can see: [lo, hi), lo on a panel boundary (the keys
// before a window's start get probability 0), hi one past the last row.
struct KeyRange {
  int64_t lo, hi;
};
KeyRange visible_keys(const AttentionShape& sh, int64_t q0, int64_t rows) {
  const int64_t lo =
      sh.window > 0 ? std::max<int64_t>(0, q0 - sh.window + 1) / kPanelColumns * kPanelColumns : 0;
  return {lo, q0 + rows};
}

// One key tile's part of a sequence: keys [begin, end), the tile `index` of the sequence's grid
// of key_tile keys.
struct KeyTile {
  int64_t index, begin, end;
};
KeyTile key_tile_of(const AttentionShape& sh, int64_t index) {
  const int64_t begin = index * sh.key_tile;
  return {index, begin, std::min(sh.s, begin + sh.key_tile)};
}

// Where a query block meets a key tile: the tile columns [k0, k0 + cols) (absolute keys), the
// block's ordinal of this tile among the tiles it meets, and whether it is the block's last.
struct Meeting {
  int64_t k0, cols, ordinal;
  bool last;
};

// For each query block that meets `tile`, in order: meet(q0, rows, meeting). Blocks before the
// tile see none of its keys (causal), and under a window blocks past some point see none.
template <typename F>
void for_each_meeting_block(const AttentionShape& sh, const KeyTile& tile, F&& meet) {
  for (int64_t q0 = tile.begin / sh.block_rows * sh.block_rows; q0 < sh.s; q0 += sh.block_rows) {
    const int64_t rows = std::min(sh.block_rows, sh.s - q0);
    const KeyRange keys = visible_keys(sh, q0, rows);
    if (keys.lo >= tile.end) return;
    const int64_t k0 = std::max(keys.lo, tile.begin), k1 = std::min(keys.hi, tile.end);
    if (k0 >= k1) continue;
    meet(q0, rows,
         Meeting{k0, k1 - k0, tile.index - keys.lo / sh.key_tile,
                 (keys.hi - 1) / sh.key_tile == tile.index});
  }
}

// The query rows of a tile in groups, each with the tile columns [0, c) it needs: one group
// when the whole tile is at or below the diagonal; on the diagonal, groups of kDiagonalRows
// rows, each up to its last row's own key, since columns right of that are masked for all of
// its rows (so about 1/8 of a 128-row diagonal tile is formed for nothing, not half of it).
constexpr int64_t kDiagonalRows = 32;
template <typename F>
void for_each_row_group(int64_t q0, int64_t rows, int64_t k0, int64_t cols, F&& group) {
  if (k0 + cols <= q0 + 1) return group(int64_t(0), rows, cols);
  for (int64_t r0 = 0; r0 < rows; r0 += kDiagonalRows) {
    const int64_t r = std::min(kDiagonalRows, rows - r0);
    const int64_t c = std::min(cols, q0 + r0 + r - k0);
    if (c > 0) group(r0, r, c);
  }
}

// Whether every row of [q0, q0 + rows) sees every key of [k0, k0 + cols).
bool whole_tile_visible(const AttentionShape& sh, int64_t q0, int64_t rows, int64_t k0,
                        int64_t cols) {
  return k0 + cols <= q0 + 1 && (sh.window <= 0 || k0 >= q0 + rows - sh.window);
}

// The forward's scores of a tile every row sees whole, on the fp32 tile path: S = scale Q K^T
// with each row's maximum (tile_max) formed in the product's registers, so the online softmax
// needs no pass to find it. panel0: the tile's first column in keys_t. False (nothing done)
// elsewhere.
template <typename T>
bool scores_with_max(const AttentionShape& sh, int64_t q0, int64_t rows, int64_t k0, int64_t cols,
                     int64_t panel0, bool tiles, const T* q_rows, int64_t q_stride,
                     const Panels& keys_t, T* scores, int64_t ld, T* max_lanes, T* tile_max) {
  if constexpr (std::is_same_v<T, float>) {
    if (!tiles || panel0 % kPanelColumns != 0 || !whole_tile_visible(sh, q0, rows, k0, cols))
      return false;
    tile_gemm_row_max(rows, cols, sh.d, float(sh.scale), q_rows, q_stride, 1,
                      keys_t.columns_from(panel0), scores, ld, tile_max, max_lanes);
    return true;
  }
  return false;
}

// The score tiles' row stride: the key tile plus one cache line, so a tile's rows (2 KB apart
// for 512 keys) do not all fall on the same two L1 sets while the products broadcast from 12
// of them at once.
template <typename T>
int64_t score_stride(const AttentionShape& sh) {
  return sh.key_tile + 64 / int64_t(sizeof(T));
}

// A query block's turn at a key tile: the items of one call run on several threads, and the
// block's running state (online softmax, dQ) must meet its tiles in order for the result not
// to depend on which thread took what. `done` counts the block's tiles finished.
void wait_for_turn(const int32_t* done, int64_t ordinal) {
  for (int spins = 0; __atomic_load_n(done, __ATOMIC_ACQUIRE) != ordinal; ++spins) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (spins > 4096) std::this_thread::yield();
  }
}
void end_turn(int32_t* done, int64_t ordinal) {
  __atomic_store_n(done, int32_t(ordinal + 1), __ATOMIC_RELEASE);
}

template <typename T>
void forward_tile(const AttentionShape& sh, HeadRows<const T> q, HeadRows<const T> k,
                  HeadRows<const T> v, HeadRows<T> out, T* lse, int64_t batch, int64_t head,
                  const KeyTile& tile, T* state, int32_t* done, T* workspace) {
  const int64_t d = sh.d, ld = score_stride<T>(sh), kv_head = head / sh.group;
  T* scores = workspace;                      // [block_rows, ld]
  T* tile_max = scores + sh.block_rows * ld;  // [block_rows]
  T* max_lanes = tile_max + sh.block_rows;    // [block_rows, 16]
  // The tile's keys and values; k0 below is a key, k0 - tile.begin its column in the panels.
  const T* k_rows = k.at(batch, kv_head, tile.begin);
  const T* v_rows = v.at(batch, kv_head, tile.begin);
  const bool tiles = tile_products<T>();
  T* space = max_lanes + 16 * sh.block_rows;
  Panels keys_t{}, values{};
  if (tiles) {
    keys_t = pack(k_rows, k.row_stride, tile.end - tile.begin, d, true, space);
    values = pack(v_rows, v.row_stride, tile.end - tile.begin, d, false, space);
  }
  // Each row's running output, maximum and sum, carried from tile to tile.
  T* acc_rows = state;           // [s, d]
  T* m_rows = state + sh.s * d;  // [s]
  T* l_rows = m_rows + sh.s;     // [s]
  for_each_meeting_block(sh, tile, [&](int64_t q0, int64_t rows, const Meeting& at) {
    const T* q_rows = q.at(batch, head, q0);
    T *acc = acc_rows + q0 * d, *m = m_rows + q0, *l = l_rows + q0;
    const int64_t k0 = at.k0, cols = at.cols, panel0 = k0 - tile.begin;
    wait_for_turn(done + q0 / sh.block_rows, at.ordinal);
    if (at.ordinal == 0) {
      std::fill(acc, acc + rows * d, T(0));
      std::fill(m, m + rows, -std::numeric_limits<T>::infinity());
      std::fill(l, l + rows, T(0));
    }
    prefetch_rows(q_rows + rows * q.row_stride, q.row_stride,
                  std::min(sh.block_rows, sh.s - q0 - rows), d);
    // A tile every row sees whole has its rows' maxima formed in the product's registers.
    if (scores_with_max(sh, q0, rows, k0, cols, panel0, tiles, q_rows, q.row_stride, keys_t, scores,
                        ld, max_lanes, tile_max)) {
      online_softmax_pass(tiles, scores, ld, rows, cols, q0, k0, sh.window, m, l, acc, d,
                          static_cast<const T*>(tile_max));
    } else {
      // Scores only where some row of the group can see the key: the online softmax reads
      // visible columns only and writes 0 to the others, so P V below adds nothing for them.
      for_each_row_group(q0, rows, k0, cols, [&](int64_t r0, int64_t r, int64_t c) {
        product_a_xt(r, c, d, T(sh.scale), q_rows + r0 * q.row_stride, q.row_stride, k_rows,
                     k.row_stride, panel0, tiles ? &keys_t : nullptr, scores + r0 * ld, ld);
      });
      online_softmax_pass(tiles, scores, ld, rows, cols, q0, k0, sh.window, m, l, acc, d,
                          static_cast<const T*>(nullptr));
    }
    for_each_row_group(q0, rows, k0, cols, [&](int64_t r0, int64_t r, int64_t c) {
      product_add(false, r, d, c, T(1), scores + r0 * ld, ld, v_rows, v.row_stride, panel0,
                  tiles ? &values : nullptr, acc + r0 * d, d);
    });
    if (at.last) {
      for (int64_t r = 0; r < rows; ++r) {
        T* o = out.at(batch, head, q0 + r);
        const T inv = T(1) / l[r];
        for (int64_t j = 0; j < d; ++j) o[j] = acc[r * d + j] * inv;
        lse[q0 + r] = m[r] + std::log(l[r]);
      }
    }
    end_turn(done + q0 / sh.block_rows, at.ordinal);
  });
}

template <typename T>
void backward_tile(const AttentionShape& sh, HeadRows<const T> q, HeadRows<const T> k,
                   HeadRows<const T> v, HeadRows<const T> out, HeadRows<const T> d_out,
                   const T* lse, HeadRows<T> dq, HeadRows<T> dk, HeadRows<T> dv, int64_t batch,
                   int64_t kv_head, const KeyTile& tile, T* state, int32_t* done, T* workspace) {
  const int64_t d = sh.d, ld = score_stride<T>(sh), keys = tile.end - tile.begin;
  const int64_t blocks = (sh.s + sh.block_rows - 1) / sh.block_rows;
  T* p = workspace;                // [block_rows, ld]
  T* ds = p + sh.block_rows * ld;  // [block_rows, ld]
  // The tile's dK and dV, contiguous, written to dk and dv at the end: there their rows are
  // kilobytes apart (the packed q|k|v gradient), and the two products adding into them ran
  // slower than into rows d apart.
  T* dk_acc = ds + sh.block_rows * ld;  // [keys, d]
  T* dv_acc = dk_acc + keys * d;        // [keys, d]
  std::fill(dk_acc, dv_acc + keys * d, T(0));
  const T* k_rows = k.at(batch, kv_head, tile.begin);
  const T* v_rows = v.at(batch, kv_head, tile.begin);
  const T scale = T(sh.scale);
  const bool tiles = tile_products<T>();
  T* space = dv_acc + keys * d;
  Panels keys_t{}, values_t{}, keys_p{}, queries{}, grads{};
  if (tiles) {
    keys_t = pack(k_rows, k.row_stride, keys, d, true, space);
    values_t = pack(v_rows, v.row_stride, keys, d, true, space);
    keys_p = pack(k_rows, k.row_stride, keys, d, false, space);
  }
  T* const block_space = space;  // the query block's Q and dO
  for (int64_t head = kv_head * sh.group; head < (kv_head + 1) * sh.group; ++head) {
    // Each row's dQ (unscaled) and D carried from tile to tile.
    const int64_t member = head - kv_head * sh.group;
    T* dq_rows = state + member * sh.s * (d + 1);  // [s, d]
    T* dot_rows = dq_rows + sh.s * d;              // [s]
    int32_t* head_done = done + member * blocks;
    for_each_meeting_block(sh, tile, [&](int64_t q0, int64_t rows, const Meeting& at) {
      const T* q_rows = q.at(batch, head, q0);
      const T* g_rows = d_out.at(batch, head, q0);
      const T* lse_rows = lse + head * sh.s + q0;
      T *dq_acc = dq_rows + q0 * d, *row_dot = dot_rows + q0;
      const int64_t k0 = at.k0, cols = at.cols, panel0 = k0 - tile.begin;
      wait_for_turn(head_done + q0 / sh.block_rows, at.ordinal);
      if (at.ordinal == 0) {
        // D_t = sum_j dO_tj O_tj: the softmax backward's row term.
        dots(g_rows, d_out.row_stride, out.at(batch, head, q0), out.row_stride, rows, d, row_dot);
        std::fill(dq_acc, dq_acc + rows * d, T(0));
      }
      if (tiles) {
        space = block_space;
        queries = pack(q_rows, q.row_stride, rows, d, false, space);
        grads = pack(g_rows, d_out.row_stride, rows, d, false, space);
      }
      const int64_t next_rows = std::min(sh.block_rows, sh.s - q0 - rows);
      prefetch_rows(q_rows + rows * q.row_stride, q.row_stride, next_rows, d);
      prefetch_rows(g_rows + rows * d_out.row_stride, d_out.row_stride, next_rows, d);
      if (at.ordinal == 0)
        prefetch_rows(out.at(batch, head, q0 + rows), out.row_stride, next_rows, d);
      for_each_row_group(q0, rows, k0, cols, [&](int64_t r0, int64_t r, int64_t c) {
        product_a_xt(r, c, d, scale, q_rows + r0 * q.row_stride, q.row_stride, k_rows, k.row_stride,
                     panel0, tiles ? &keys_t : nullptr, p + r0 * ld, ld);
      });
      probabilities_pass(tiles, p, ld, rows, cols, q0, k0, sh.window, lse_rows);
      for_each_row_group(q0, rows, k0, cols, [&](int64_t r0, int64_t r, int64_t c) {
        T* p_rows = p + r0 * ld;
        T* ds_rows = ds + r0 * ld;
        const int64_t key = k0 - tile.begin;  // the group's first row of dk_acc, dv_acc
        // dV += P^T dO
        product_add(true, c, d, r, T(1), p_rows, ld, g_rows, d_out.row_stride, r0,
                    tiles ? &grads : nullptr, dv_acc + key * d, d);
        // dP = dO V^T, then dS = P (dP - D)
        product_a_xt(r, c, d, T(1), g_rows + r0 * d_out.row_stride, d_out.row_stride, v_rows,
                     v.row_stride, panel0, tiles ? &values_t : nullptr, ds_rows, ld);
        score_gradient(ds_rows, p_rows, ld, r, c, row_dot + r0);
        // dQ += dS K (scaled at the end), dK += scale dS^T Q
        product_add(false, r, d, c, T(1), ds_rows, ld, k_rows, k.row_stride, panel0,
                    tiles ? &keys_p : nullptr, dq_acc + r0 * d, d);
        product_add(true, c, d, r, scale, ds_rows, ld, q_rows, q.row_stride, r0,
                    tiles ? &queries : nullptr, dk_acc + key * d, d);
      });
      if (at.last) write_rows(rows, d, scale, dq_acc, d, dq.at(batch, head, q0), dq.row_stride);
      end_turn(head_done + q0 / sh.block_rows, at.ordinal);
    });
  }
  write_rows(keys, d, T(1), dk_acc, d, dk.at(batch, kv_head, tile.begin), dk.row_stride);
  write_rows(keys, d, T(1), dv_acc, d, dv.at(batch, kv_head, tile.begin), dv.row_stride);
  streamed_rows_visible();
}

}  // namespace

bool attention_blas_available() {
  return blas().sgemm != nullptr && blas().dgemm != nullptr;
}

int64_t attention_key_tiles(const AttentionShape& sh) {
  return (sh.s + sh.key_tile - 1) / sh.key_tile;
}

int64_t attention_query_blocks(const AttentionShape& sh) {
  return (sh.s + sh.block_rows - 1) / sh.block_rows;
}

int64_t attention_forward_state(const AttentionShape& sh) {
  return sh.s * (sh.d + 2);
}

int64_t attention_backward_state(const AttentionShape& sh) {
  return sh.group * sh.s * (sh.d + 1);
}

int64_t attention_workspace(const AttentionShape& sh) {
  // The tile products' panels of one key tile: K^T and V (forward); K^T, V^T, K, and the query
  // block's Q and dO (backward).
  const int64_t transposed = panel_elements(sh.d, sh.key_tile);
  const int64_t by_rows = panel_elements(sh.key_tile, sh.d);
  const int64_t panels = 2 * transposed + by_rows + 2 * panel_elements(sh.block_rows, sh.d);
  // Two score tiles of score_stride<float> (that of double is shorter in elements), the
  // forward's row maxima (one and 16 lanes a row), the backward's dK and dV of one tile.
  return 2 * sh.block_rows * score_stride<float>(sh) + 17 * sh.block_rows + 2 * sh.key_tile * sh.d +
         panels;
}

#define RETORT_ATTENTION_ENTRY_POINTS(T)                                                          \
  void attention_forward_tile(const AttentionShape& shape, HeadRows<const T> q,                   \
                              HeadRows<const T> k, HeadRows<const T> v, HeadRows<T> out, T* lse,  \
                              int64_t batch, int64_t head, int64_t tile, T* state, int32_t* done, \
                              T* workspace) {                                                     \
    forward_tile(shape, q, k, v, out, lse, batch, head, key_tile_of(shape, tile), state, done,    \
                 workspace);                                                                      \
  }                                                                                               \
  void attention_backward_tile(const AttentionShape& shape, HeadRows<const T> q,                  \
                               HeadRows<const T> k, HeadRows<const T> v, HeadRows<const T> out,   \
                               HeadRows<const T> d_out, const T* lse, HeadRows<T> dq,             \
                               HeadRows<T> dk, HeadRows<T> dv, int64_t batch, int64_t kv_head,    \
                               int64_t tile, T* state, int32_t* done, T* workspace) {             \
    backward_tile(shape, q, k, v, out, d_out, lse, dq, dk, dv, batch, kv_head,                    \
                  key_tile_of(shape, tile), state, done, workspace);                              \
  }
RETORT_ATTENTION_ENTRY_POINTS(float)
RETORT_ATTENTION_ENTRY_POINTS(double)
#undef RETORT_ATTENTION_ENTRY_POINTS

}  // namespace retort::kernels
