// distill/logit_kernels.cpp: see logit_kernels.h. The public overloads are target_clones
// wrappers around always-inline templates, so each loop is compiled once per ISA.
// Reductions run as `omp simd` over blocks of kBlock values in T, and the blocks are summed in
// double: a float sum over 32000 vocabulary entries in 16 lanes would otherwise carry about
// 2000 roundings per lane.
#include "distill/logit_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/simd_clones.h"
#include "common/vector_exp.h"

namespace retort::distill::kernels {
namespace {

using retort::kernels::vector_exp;

constexpr int64_t kBlock = 512;

template <typename T>
RETORT_ALWAYS_INLINE T row_max(const T* __restrict x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

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
    max_s[r] = row_max(s, x.cols);
    max_t[r] = row_max(t, x.cols);
    sum_s[r] = T(row_exp_sum(s, x.cols, max_s[r], inv_t));
    sum_t[r] = T(row_exp_sum(t, x.cols, max_t[r], inv_t));
  }
}

template <typename T>
RETORT_ALWAYS_INLINE T row_lse(const T* x, int64_t n, T inv_t) {
  const T m = row_max(x, n);
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
  if (!kd.grad)
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

RETORT_SIMD_CLONES void logit_row_stats(const LogitRows<float>& x, float* max_s, float* sum_s,
                                        float* max_t, float* sum_t) {
  stats_rows(x, max_s, sum_s, max_t, sum_t);
}
RETORT_SIMD_CLONES void logit_row_stats(const LogitRows<double>& x, double* max_s, double* sum_s,
                                        double* max_t, double* sum_t) {
  stats_rows(x, max_s, sum_s, max_t, sum_t);
}
RETORT_SIMD_CLONES void dense_kd_rows(const LogitRows<float>& x, const DenseKd<float>& kd) {
  kd_rows(x, kd);
}
RETORT_SIMD_CLONES void dense_kd_rows(const LogitRows<double>& x, const DenseKd<double>& kd) {
  kd_rows(x, kd);
}

}  // namespace retort::distill::kernels
