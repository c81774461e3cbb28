// kernels/logit_kernels.h: one-pass CPU loops for the dense logit losses (forward KL and soft
// cross-entropy against a full teacher), row by row over student logits s and teacher logits
// t at inverse temperature 1/T: the log-sum-exps, each token's loss term and the gradient
// with respect to s, with each row read once per pass while it sits in cache instead of a
// dozen torch passes over [tokens, vocab]. No torch here: distill/logit_losses.cpp splits the
// rows across threads and reduces over the TP group. Compiled per ISA (kernels/isa_variants.h).
#pragma once
#include <cstdint>

namespace retort::kernels {

// Rows of `cols` values; a row of s starts s_stride values after the previous one (likewise
// t and grad), so column slices of wider tensors can be passed.
template <typename T>
struct LogitRows {
  const T* s = nullptr;
  const T* t = nullptr;
  int64_t s_stride = 0, t_stride = 0, rows = 0, cols = 0;
  double inv_temperature = 1;
};

// Per row, over this slice of the vocabulary: max_s[r] = max_v s, sum_s[r] = sum_v
// exp((s - max_s) / T), likewise for t, so log-sum-exp(s / T) = max_s / T + log(sum_s) once
// combined over the slices. Sums are accumulated in double over blocks.
void logit_row_stats(const LogitRows<float>& x, float* max_s, float* sum_s, float* max_t,
                     float* sum_t);
void logit_row_stats(const LogitRows<double>& x, double* max_s, double* sum_s, double* max_t,
                     double* sum_t);

// The dense loss terms given each row's log-sum-exps over the whole vocabulary (lse_s, lse_t
// of s / T and t / T), with p = exp(t / T - lse_t), q = exp(s / T - lse_s):
//   partial[r] = sum_v p (t - s) / T     (forward_kl: KL = partial + lse_s - lse_t)
//              = -sum_v p s / T          (soft_ce:    CE = partial + lse_s)
// and, when grad is given, grad[r, v] = kd_c[r] (q - p) + ce_c[r] q (ce_c may be null: 0),
// the gradient of kd_c * KL + ce_c * cross-entropy with q at T = 1 (callers pass ce_c only
// then). partial may be null when only the gradient is wanted.
// whole_rows: the slice is the whole vocabulary, lse_s and lse_t are computed here per row
// (written out) instead of read, and each row is read once for both.
// scratch_t (whole_rows, with grad): the teacher rows may be overwritten (x.t's rows, as
// writable), and grad may be x.s itself, the gradient replacing the student's logits. The
// loop then keeps each exp it forms, two per entry instead of four, and the caller needs no
// third [rows, cols] buffer.
template <typename T>
struct DenseKd {
  bool forward_kl = true;
  bool whole_rows = false;
  T* scratch_t = nullptr;
  T* lse_s = nullptr;
  T* lse_t = nullptr;
  T* partial = nullptr;
  T* grad = nullptr;
  int64_t grad_stride = 0;
  const T* kd_c = nullptr;
  const T* ce_c = nullptr;
};
void dense_kd_rows(const LogitRows<float>& x, const DenseKd<float>& kd);
void dense_kd_rows(const LogitRows<double>& x, const DenseKd<double>& kd);

}  // namespace retort::kernels
