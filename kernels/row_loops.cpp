// kernels/row_loops.cpp: see row_loops.h. Each public overload is a set of per-ISA variants
// (kernels/isa_variants.h) of one always-inline template, so the loop body is compiled once
// per ISA.
// `#pragma omp simd` (this file is built with -fopenmp-simd, no OpenMP runtime) lets the
// float reductions vectorise without -ffast-math for the whole file. Built with
// -fno-trapping-math (layers/CMakeLists.txt): without it GCC keeps floor scalar and the
// SwiGLU loops do not vectorise at all.
#include "kernels/row_loops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/bfloat16.h"
#include "kernels/isa_variants.h"
#include "kernels/vector_exp.h"
#include "kernels/vector_max.h"

namespace retort::kernels {
namespace {

using retort::kernels::max_of;
using retort::kernels::vector_exp;

template <typename T>
RETORT_ALWAYS_INLINE T sigmoid(T x) {
  return T(1) / (T(1) + vector_exp(-x));
}

// X, W, Y: the element types of x, w and y (float, double or Bf16); C: the type computed in.
template <typename X, typename W, typename Y, typename C>
RETORT_ALWAYS_INLINE void rms_forward_rows(const X* __restrict x, const W* __restrict w,
                                           Y* __restrict y, C* __restrict inv_rms, int64_t rows,
                                           int64_t n, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const X* xr = x + r * n;
    Y* yr = y + r * n;
    C squares = 0;
#pragma omp simd reduction(+ : squares)
    for (int64_t j = 0; j < n; ++j) squares += widen(xr[j]) * widen(xr[j]);
    const C inv = C(1) / std::sqrt(squares / C(n) + C(eps));
    inv_rms[r] = inv;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) store(yr + j, (widen(xr[j]) * inv) * widen(w[j]));
  }
}

template <typename DY, typename X, typename W, typename DX, typename C>
RETORT_ALWAYS_INLINE void rms_backward_rows(const DY* __restrict dy, const X* __restrict x,
                                            const W* __restrict w, const C* __restrict inv_rms,
                                            DX* __restrict dx, C* __restrict dw_partial,
                                            int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const DY* dyr = dy + r * n;
    const X* xr = x + r * n;
    DX* dxr = dx + r * n;
    const C inv = inv_rms[r];
    C dot = 0;  // sum_j (dy_j w_j) (x_j inv)
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < n; ++j) {
      dot += widen(dyr[j]) * widen(w[j]) * (widen(xr[j]) * inv);
      dw_partial[j] += widen(dyr[j]) * (widen(xr[j]) * inv);
    }
    const C mean_dot = dot / C(n);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j)
      store(dxr + j, inv * (widen(dyr[j]) * widen(w[j]) - (widen(xr[j]) * inv) * mean_dot));
  }
}

template <typename T>
RETORT_ALWAYS_INLINE void swiglu_forward_rows(const T* __restrict gate_up, T* __restrict out,
                                              int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * 2 * n;
    const T* up = gate + n;
    T* o = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const auto g = widen(gate[i]);
      store(o + i, g * sigmoid(g) * widen(up[i]));
    }
  }
}

template <typename T>
RETORT_ALWAYS_INLINE void swiglu_backward_rows(const T* __restrict dy, const T* __restrict gate_up,
                                               T* __restrict d_gate_up, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * 2 * n;
    const T* up = gate + n;
    const T* dyr = dy + r * n;
    T* d_gate = d_gate_up + r * 2 * n;
    T* d_up = d_gate + n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const auto g = widen(gate[i]);
      const decltype(g) one = 1, s = sigmoid(g), d = widen(dyr[i]);
      store(d_gate + i, d * widen(up[i]) * (s * (one + g * (one - s))));
      store(d_up + i, d * (g * s));
    }
  }
}

template <typename X, typename T>
RETORT_ALWAYS_INLINE void rope_rows(X* __restrict x, const T* __restrict cos,
                                    const T* __restrict sin, int64_t row_begin, int64_t row_end,
                                    int64_t row_stride, int64_t seq_len, int64_t heads, int64_t d,
                                    bool inverse) {
  const int64_t half = d / 2;
  const T sign = inverse ? T(-1) : T(1);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const T* c = cos + (r % seq_len) * d;
    const T* s = sin + (r % seq_len) * d;
    for (int64_t h = 0; h < heads; ++h) {
      X* x1 = x + r * row_stride + h * d;
      X* x2 = x1 + half;
#pragma omp simd
      for (int64_t j = 0; j < half; ++j) {
        const T a = widen(x1[j]), b = widen(x2[j]);
        store(x1 + j, a * c[j] - sign * (b * s[j]));
        store(x2 + j, b * c[half + j] + sign * (a * s[half + j]));
      }
    }
  }
}

// Blocks of the exp sum are added in double: a float sum over 32000 entries in 16 lanes would
// carry about 2000 roundings per lane.
constexpr int64_t kSumBlock = 512;

// The sum of term(j) over [begin, end) in an order fixed here, not by the compiler: lane k adds
// the terms j = begin + k (mod 16) in turn, then the 16 lanes add pairwise (k + 8 into k, then
// k + 4, ...). A reduction clause would let the compiler pick the lanes by vector width and
// element type, so the float and the bf16 loops (and one ISA and another) could sum the same
// values in different orders; this way they sum them alike on any machine.
constexpr int kSumLanes = 16;

template <typename T, typename Term>
RETORT_ALWAYS_INLINE T sum_in_lanes(int64_t begin, int64_t end, Term&& term) {
  T lanes[kSumLanes] = {};
  int64_t j = begin;
  for (; j + kSumLanes <= end; j += kSumLanes) {
#pragma omp simd
    for (int k = 0; k < kSumLanes; ++k) lanes[k] += term(j + k);
  }
  for (int k = 0; j + k < end; ++k) lanes[k] += term(j + k);
  for (int width = kSumLanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) lanes[k] += lanes[k + width];
  return lanes[0];
}

template <typename T>
RETORT_ALWAYS_INLINE void cross_entropy_row_loop(T* z, int64_t rows, int64_t cols, int64_t real,
                                                 int64_t stride, const int64_t* target, T* max_out,
                                                 T* sum_out, T* loss, const T* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict row = z + r * stride;
    const T m = max_of(row, real);
    const T target_logit = target[r] >= 0 ? row[target[r]] : m;
    double sum = 0;
    for (int64_t b = 0; b < real; b += kSumBlock) {
      const int64_t e = std::min(real, b + kSumBlock);
      const T part = sum_in_lanes<T>(b, e, [&](int64_t j) {
        const T v = vector_exp(row[j] - m);
        row[j] = v;
        return v;
      });
      sum += double(part);
    }
    max_out[r] = m;
    sum_out[r] = T(sum);
    loss[r] = target[r] >= 0 ? T(std::log(sum)) + m - target_logit : T(0);
    if (!scale) continue;
    // As softmax_gradient_rows forms it again from the saved max and sum, bit for bit.
    const T factor = scale[r] / sum_out[r];
#pragma omp simd
    for (int64_t j = 0; j < real; ++j) row[j] *= factor;
    for (int64_t j = real; j < cols; ++j) row[j] = 0;
    if (target[r] >= 0) row[target[r]] -= scale[r];
  }
}

template <typename T>
RETORT_ALWAYS_INLINE void softmax_gradient_row_loop(T* z, int64_t rows, int64_t cols, int64_t real,
                                                    int64_t stride, const T* max, const T* sum,
                                                    const T* scale, const int64_t* target) {
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict row = z + r * stride;
    const T m = max[r], factor = scale[r] / sum[r];
#pragma omp simd
    for (int64_t j = 0; j < real; ++j) row[j] = vector_exp(row[j] - m) * factor;
    for (int64_t j = real; j < cols; ++j) row[j] = 0;
    if (target[r] >= 0) row[target[r]] -= scale[r];
  }
}

// bf16 logits: the same float32 steps on the widened logits, the exponentials formed again in
// the gradient pass rather than stored (a bf16 store would round them before the scale), and the
// gradient rounded once, so the result is the float32 loop's rounded to bf16, bit for bit.
// One row's gradient scale * (softmax - onehot(target)) in place of its logits, padding 0.
RETORT_ALWAYS_INLINE void softmax_gradient_row_bf16(Bf16* __restrict row, int64_t cols,
                                                    int64_t real, float m, float factor,
                                                    float scale, int64_t target) {
  // The target's gradient from its logit before the row is overwritten.
  const float target_grad =
      target >= 0 ? vector_exp(widen(row[target]) - m) * factor - scale : 0.0f;
#pragma omp simd
  for (int64_t j = 0; j < real; ++j) store(row + j, vector_exp(widen(row[j]) - m) * factor);
  for (int64_t j = real; j < cols; ++j) row[j] = Bf16{0};
  if (target >= 0) store(row + target, target_grad);
}

RETORT_ALWAYS_INLINE void cross_entropy_row_loop_bf16(Bf16* z, int64_t rows, int64_t cols,
                                                      int64_t real, int64_t stride,
                                                      const int64_t* target, float* max_out,
                                                      float* sum_out, float* loss,
                                                      const float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    Bf16* __restrict row = z + r * stride;
    const float m = max_of(row, real);
    const float target_logit = target[r] >= 0 ? widen(row[target[r]]) : m;
    double sum = 0;
    for (int64_t b = 0; b < real; b += kSumBlock) {
      const int64_t e = std::min(real, b + kSumBlock);
      const float part =
          sum_in_lanes<float>(b, e, [&](int64_t j) { return vector_exp(widen(row[j]) - m); });
      sum += double(part);
    }
    max_out[r] = m;
    sum_out[r] = float(sum);
    loss[r] = target[r] >= 0 ? float(std::log(sum)) + m - target_logit : 0.0f;
    if (scale)
      softmax_gradient_row_bf16(row, cols, real, m, scale[r] / sum_out[r], scale[r], target[r]);
  }
}

RETORT_ALWAYS_INLINE void softmax_gradient_row_loop_bf16(Bf16* z, int64_t rows, int64_t cols,
                                                         int64_t real, int64_t stride,
                                                         const float* max, const float* sum,
                                                         const float* scale,
                                                         const int64_t* target) {
  for (int64_t r = 0; r < rows; ++r)
    softmax_gradient_row_bf16(z + r * stride, cols, real, max[r], scale[r] / sum[r], scale[r],
                              target[r]);
}

}  // namespace

RETORT_ISA_VARIANTS(cross_entropy_rows,
                    (float* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                     const int64_t* target, float* max_out, float* sum_out, float* loss,
                     const float* scale),
                    (z, rows, cols, real, stride, target, max_out, sum_out, loss, scale),
                    cross_entropy_row_loop)
RETORT_ISA_VARIANTS(cross_entropy_rows,
                    (double* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                     const int64_t* target, double* max_out, double* sum_out, double* loss,
                     const double* scale),
                    (z, rows, cols, real, stride, target, max_out, sum_out, loss, scale),
                    cross_entropy_row_loop)

RETORT_ISA_VARIANTS(softmax_gradient_rows,
                    (float* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                     const float* max, const float* sum, const float* scale, const int64_t* target),
                    (z, rows, cols, real, stride, max, sum, scale, target),
                    softmax_gradient_row_loop)
RETORT_ISA_VARIANTS(softmax_gradient_rows,
                    (double* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                     const double* max, const double* sum, const double* scale,
                     const int64_t* target),
                    (z, rows, cols, real, stride, max, sum, scale, target),
                    softmax_gradient_row_loop)
RETORT_ISA_VARIANTS(rms_norm_forward,
                    (const float* x, const float* w, float* y, float* inv_rms, int64_t rows,
                     int64_t n, double eps),
                    (x, w, y, inv_rms, rows, n, eps), rms_forward_rows)
RETORT_ISA_VARIANTS(rms_norm_forward,
                    (const double* x, const double* w, double* y, double* inv_rms, int64_t rows,
                     int64_t n, double eps),
                    (x, w, y, inv_rms, rows, n, eps), rms_forward_rows)
RETORT_ISA_VARIANTS(rms_norm_backward,
                    (const float* dy, const float* x, const float* w, const float* inv_rms,
                     float* dx, float* dw_partial, int64_t rows, int64_t n),
                    (dy, x, w, inv_rms, dx, dw_partial, rows, n), rms_backward_rows)
RETORT_ISA_VARIANTS(rms_norm_backward,
                    (const double* dy, const double* x, const double* w, const double* inv_rms,
                     double* dx, double* dw_partial, int64_t rows, int64_t n),
                    (dy, x, w, inv_rms, dx, dw_partial, rows, n), rms_backward_rows)
RETORT_ISA_VARIANTS(swiglu_forward, (const float* gate_up, float* out, int64_t rows, int64_t n),
                    (gate_up, out, rows, n), swiglu_forward_rows)
RETORT_ISA_VARIANTS(swiglu_forward, (const double* gate_up, double* out, int64_t rows, int64_t n),
                    (gate_up, out, rows, n), swiglu_forward_rows)
RETORT_ISA_VARIANTS(swiglu_backward,
                    (const float* dy, const float* gate_up, float* d_gate_up, int64_t rows,
                     int64_t n),
                    (dy, gate_up, d_gate_up, rows, n), swiglu_backward_rows)
RETORT_ISA_VARIANTS(swiglu_backward,
                    (const double* dy, const double* gate_up, double* d_gate_up, int64_t rows,
                     int64_t n),
                    (dy, gate_up, d_gate_up, rows, n), swiglu_backward_rows)
RETORT_ISA_VARIANTS(rope_rotate,
                    (float* x, const float* cos, const float* sin, int64_t row_begin,
                     int64_t row_end, int64_t row_stride, int64_t seq_len, int64_t heads, int64_t d,
                     bool inverse),
                    (x, cos, sin, row_begin, row_end, row_stride, seq_len, heads, d, inverse),
                    rope_rows)
RETORT_ISA_VARIANTS(rope_rotate,
                    (double* x, const double* cos, const double* sin, int64_t row_begin,
                     int64_t row_end, int64_t row_stride, int64_t seq_len, int64_t heads, int64_t d,
                     bool inverse),
                    (x, cos, sin, row_begin, row_end, row_stride, seq_len, heads, d, inverse),
                    rope_rows)

RETORT_ISA_VARIANTS(rms_norm_forward,
                    (const Bf16* x, const float* w, Bf16* y, float* inv_rms, int64_t rows,
                     int64_t n, double eps),
                    (x, w, y, inv_rms, rows, n, eps), rms_forward_rows)
RETORT_ISA_VARIANTS(rms_norm_forward,
                    (const float* x, const float* w, Bf16* y, float* inv_rms, int64_t rows,
                     int64_t n, double eps),
                    (x, w, y, inv_rms, rows, n, eps), rms_forward_rows)
RETORT_ISA_VARIANTS(rms_norm_backward,
                    (const Bf16* dy, const Bf16* x, const float* w, const float* inv_rms, Bf16* dx,
                     float* dw_partial, int64_t rows, int64_t n),
                    (dy, x, w, inv_rms, dx, dw_partial, rows, n), rms_backward_rows)
RETORT_ISA_VARIANTS(rms_norm_backward,
                    (const Bf16* dy, const float* x, const float* w, const float* inv_rms,
                     float* dx, float* dw_partial, int64_t rows, int64_t n),
                    (dy, x, w, inv_rms, dx, dw_partial, rows, n), rms_backward_rows)
RETORT_ISA_VARIANTS(swiglu_forward, (const Bf16* gate_up, Bf16* out, int64_t rows, int64_t n),
                    (gate_up, out, rows, n), swiglu_forward_rows)
RETORT_ISA_VARIANTS(swiglu_backward,
                    (const Bf16* dy, const Bf16* gate_up, Bf16* d_gate_up, int64_t rows, int64_t n),
                    (dy, gate_up, d_gate_up, rows, n), swiglu_backward_rows)
RETORT_ISA_VARIANTS(rope_rotate,
                    (Bf16 * x, const float* cos, const float* sin, int64_t row_begin,
                     int64_t row_end, int64_t row_stride, int64_t seq_len, int64_t heads, int64_t d,
                     bool inverse),
                    (x, cos, sin, row_begin, row_end, row_stride, seq_len, heads, d, inverse),
                    rope_rows)

RETORT_ISA_VARIANTS(cross_entropy_rows,
                    (Bf16 * z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                     const int64_t* target, float* max_out, float* sum_out, float* loss,
                     const float* scale),
                    (z, rows, cols, real, stride, target, max_out, sum_out, loss, scale),
                    cross_entropy_row_loop_bf16)
RETORT_ISA_VARIANTS(softmax_gradient_rows,
                    (Bf16 * z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                     const float* max, const float* sum, const float* scale, const int64_t* target),
                    (z, rows, cols, real, stride, max, sum, scale, target),
                    softmax_gradient_row_loop_bf16)

}  // namespace retort::kernels
