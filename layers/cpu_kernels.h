// layers/cpu_kernels.h: one-pass CPU loops over contiguous rows for the element-wise parts of
// a Llama block: RMSNorm forward and backward, SwiGLU forward and backward, rotary embedding
// applied in place. No torch here: the callers (layers/fused_ops.cpp) split rows across
// threads and wrap these in autograd functions. Each loop is compiled per ISA and picked at
// load time (common/simd_clones.h).
#pragma once
#include <cstdint>

namespace retort::layers::kernels {

// y = x * inv_rms * w per row of n; inv_rms[r] = 1 / sqrt(mean(x_r^2) + eps).
void rms_norm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t rows,
                      int64_t n, double eps);
void rms_norm_forward(const double* x, const double* w, double* y, double* inv_rms, int64_t rows,
                      int64_t n, double eps);

// dx = inv * (g - xhat * mean(g * xhat)) with g = dy * w and xhat = x * inv, per row;
// dw_partial[j] += sum over these rows of dy * xhat (the caller sums partials in a fixed order).
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* inv_rms,
                       float* dx, float* dw_partial, int64_t rows, int64_t n);
void rms_norm_backward(const double* dy, const double* x, const double* w, const double* inv_rms,
                       double* dx, double* dw_partial, int64_t rows, int64_t n);

// SwiGLU on packed rows: row r of gate_up holds gate (n values) then up (n values), the
// output of one matrix product by [W_gate; W_up]. out[r] = silu(gate_r) * up_r, [rows, n].
void swiglu_forward(const float* gate_up, float* out, int64_t rows, int64_t n);
void swiglu_forward(const double* gate_up, double* out, int64_t rows, int64_t n);

// d_gate = dy * up * s * (1 + gate * (1 - s)), d_up = dy * silu(gate), s = sigmoid(gate),
// written packed as gate_up is: d_gate_up [rows, 2n].
void swiglu_backward(const float* dy, const float* gate_up, float* d_gate_up, int64_t rows,
                     int64_t n);
void swiglu_backward(const double* dy, const double* gate_up, double* d_gate_up, int64_t rows,
                     int64_t n);

// Rotates, in place, the first `heads` heads of d values of rows row_begin .. row_end-1 of
// x (rows row_stride values apart, so q and k can be rotated inside a packed q|k|v row); row
// r sits at position r % seq_len: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) on the two
// halves (Hugging Face rotate-half), with cos and sin [seq_len, d]. inverse rotates by minus
// the angle, which is the backward of the forward rotation.
void rope_rotate(float* x, const float* cos, const float* sin, int64_t row_begin, int64_t row_end,
                 int64_t row_stride, int64_t seq_len, int64_t heads, int64_t d, bool inverse);
void rope_rotate(double* x, const double* cos, const double* sin, int64_t row_begin,
                 int64_t row_end, int64_t row_stride, int64_t seq_len, int64_t heads, int64_t d,
                 bool inverse);

}  // namespace retort::layers::kernels
