// kernels/logit_kernels.cpp: see logit_kernels.h. The public overloads are per-ISA variants
// (kernels/isa_variants.h) of always-inline templates, so each loop is compiled once per ISA.
// Reductions run as `omp simd` over blocks of kBlock values in T, and the blocks are summed in
// double: a float sum over 32000 vocabulary entries in 16 lanes would otherwise carry about
// 2000 roundings per lane.
#include "kernels/logit_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/isa_variants.h"
#include "kernels/vector_exp.h"
#include "kernels/vector_max.h"

namespace retort::kernels {
namespace {

using retort::kernels::max_of;
using retort::kernels::vector_exp;

constexpr int64_t kBlock = 512;

// sum_j exp(inv_t (x_j - m)).
template <typename T>
RETORT_ALWAYS_INLINE double row_exp_sum(const T* __restrict x, int64_t n, T m, T inv_t) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    T part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t j = b; j < e; ++j) part += vector_exp(inv_t * (x[j] - m));
    total += double(part);
  }
  return total;
}

template <typename T>
RETORT_ALWAYS_INLINE void stats_rows(const LogitRows<T>& x, T* max_s, T* sum_s, T* max_t,
                                     T* sum_t) {
  const T inv_t = T(x.inv_temperature);
  for (int64_t r = 0; r < x.rows; ++r) {
    const T* s = x.s + r * x.s_stride;
    const T* t = x.t + r * x.t_stride;
    max_s[r] = max_of(s, x.cols);
    max_t[r] = max_of(t, x.cols);
    sum_s[r] = T(row_exp_sum(s, x.cols, max_s[r], inv_t));
    sum_t[r] = T(row_exp_sum(t, x.cols, max_t[r], inv_t));
  }
}

template <typename T>
RETORT_ALWAYS_INLINE T row_lse(const T* x, int64_t n, T inv_t) {
  const T m = max_of(x, n);
  return inv_t * m + T(std::log(row_exp_sum(x, n, m, inv_t)));
}

// One row's partial sum and, with kGrad, its gradient: the loop is instantiated per
// (kind, gradient) pair so no branch sits inside it.
template <typename T, bool kForwardKl, bool kGrad, bool kCe>
RETORT_ALWAYS_INLINE T kd_row(const T* __restrict s, const T* __restrict t, int64_t n, T inv_t,
                              T lse_s, T lse_t, T* __restrict grad, T kd_c, T ce_c) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    T part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t j = b; j < e; ++j) {
      const T ss = s[j] * inv_t, ts = t[j] * inv_t;
      const T p = vector_exp(ts - lse_t);
      part += kForwardKl ? p * (ts - ss) : -(p * ss);
      if constexpr (kGrad) {
        const T q = vector_exp(ss - lse_s);
        grad[j] = kCe ? kd_c * (q - p) + ce_c * q : kd_c * (q - p);
      }
    }
    total += double(part);
  }
  return T(total);
}

// One row with the teacher row as scratch and grad possibly the student row itself: the row
// maxima first (no exp), then one pass forming e_s = exp((s - max_s) / T) and e_t likewise,
// their sums and sum e_t (t - s) (or -e_t s), keeping e_s in grad and e_t in t, then
// grad = kd_c (q - p) + ce_c q from q = e_s / sum_s, p = e_t / sum_t. No restrict: grad may
// alias s, and each entry is read before it is written.
template <typename T, bool kForwardKl, bool kCe>
RETORT_ALWAYS_INLINE T kd_row_in_place(const T* s, T* t, int64_t n, T inv_t, T* grad, T kd_c,
                                       T ce_c, T& lse_s, T& lse_t) {
  const T max_s = max_of(s, n), max_t = max_of(t, n);
  double sum_s = 0, sum_t = 0, weighted = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    T part_s = 0, part_t = 0, part_w = 0;
#pragma omp simd reduction(+ : part_s, part_t, part_w)
    for (int64_t j = b; j < e; ++j) {
      const T sv = s[j], tv = t[j];
      const T es = vector_exp(inv_t * (sv - max_s)), et = vector_exp(inv_t * (tv - max_t));
      part_s += es;
      part_t += et;
      part_w += kForwardKl ? et * (tv - sv) : -(et * sv);
      grad[j] = es;
      t[j] = et;
    }
    sum_s += double(part_s);
    sum_t += double(part_t);
    weighted += double(part_w);
  }
  lse_s = inv_t * max_s + T(std::log(sum_s));
  lse_t = inv_t * max_t + T(std::log(sum_t));
  const T rs = T(1.0 / sum_s), rt = T(1.0 / sum_t);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const T q = grad[j] * rs, p = t[j] * rt;
    grad[j] = kCe ? kd_c * (q - p) + ce_c * q : kd_c * (q - p);
  }
  return T(weighted / sum_t) * inv_t;
}

template <typename T, bool kForwardKl, bool kCe>
RETORT_ALWAYS_INLINE void kd_rows_in_place(const LogitRows<T>& x, const DenseKd<T>& kd) {
  const T inv_t = T(x.inv_temperature);
  for (int64_t r = 0; r < x.rows; ++r) {
    const T partial =
        kd_row_in_place<T, kForwardKl, kCe>(x.s + r * x.s_stride, kd.scratch_t + r * x.t_stride,
                                            x.cols, inv_t, kd.grad + r * kd.grad_stride, kd.kd_c[r],
                                            kCe ? kd.ce_c[r] : T(0), kd.lse_s[r], kd.lse_t[r]);
    if (kd.partial) kd.partial[r] = partial;
  }
}

template <typename T, bool kForwardKl, bool kGrad, bool kCe>
RETORT_ALWAYS_INLINE void kd_rows_as(const LogitRows<T>& x, const DenseKd<T>& kd) {
  const T inv_t = T(x.inv_temperature);
  for (int64_t r = 0; r < x.rows; ++r) {
    const T* s = x.s + r * x.s_stride;
    const T* t = x.t + r * x.t_stride;
    if (kd.whole_rows) {
      kd.lse_s[r] = row_lse(s, x.cols, inv_t);
      kd.lse_t[r] = row_lse(t, x.cols, inv_t);
    }
    const T partial =
        kd_row<T, kForwardKl, kGrad, kCe>(s, t, x.cols, inv_t, kd.lse_s[r], kd.lse_t[r],
                                          kGrad ? kd.grad + r * kd.grad_stride : nullptr,
                                          kGrad ? kd.kd_c[r] : T(0), kCe ? kd.ce_c[r] : T(0));
    if (kd.partial) kd.partial[r] = partial;
  }
}

template <typename T, bool kForwardKl>
RETORT_ALWAYS_INLINE void kd_rows_of_kind(const LogitRows<T>& x, const DenseKd<T>& kd) {
  if (kd.scratch_t && kd.ce_c)
    kd_rows_in_place<T, kForwardKl, true>(x, kd);
  else if (kd.scratch_t)
    kd_rows_in_place<T, kForwardKl, false>(x, kd);
  else if (!kd.grad)
    kd_rows_as<T, kForwardKl, false, false>(x, kd);
  else if (kd.ce_c)
    kd_rows_as<T, kForwardKl, true, true>(x, kd);
  else
    kd_rows_as<T, kForwardKl, true, false>(x, kd);
}

template <typename T>
RETORT_ALWAYS_INLINE void kd_rows(const LogitRows<T>& x, const DenseKd<T>& kd) {
  if (kd.forward_kl)
    kd_rows_of_kind<T, true>(x, kd);
  else
    kd_rows_of_kind<T, false>(x, kd);
}

}  // namespace

RETORT_ISA_VARIANTS(logit_row_stats,
                    (const LogitRows<float>& x, float* max_s, float* sum_s, float* max_t,
                     float* sum_t),
                    (x, max_s, sum_s, max_t, sum_t), stats_rows)
RETORT_ISA_VARIANTS(logit_row_stats,
                    (const LogitRows<double>& x, double* max_s, double* sum_s, double* max_t,
                     double* sum_t),
                    (x, max_s, sum_s, max_t, sum_t), stats_rows)
RETORT_ISA_VARIANTS(dense_kd_rows, (const LogitRows<float>& x, const DenseKd<float>& kd), (x, kd),
                    kd_rows)
RETORT_ISA_VARIANTS(dense_kd_rows, (const LogitRows<double>& x, const DenseKd<double>& kd), (x, kd),
                    kd_rows)

}  // namespace retort::kernels
