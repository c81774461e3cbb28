// kernels/row_loops.h: one-pass CPU loops over contiguous rows for the element-wise parts of
// a Llama block: RMSNorm forward and backward, SwiGLU forward and backward, rotary embedding
// applied in place, and the LM head's softmax cross-entropy (bf16 rows too). No torch here: the
// callers (layers/fused_ops.cpp) split rows across threads and wrap these in autograd functions.
// Each loop is compiled per ISA and picked at load time (kernels/isa_variants.h).
#pragma once
#include <cstdint>

#include "kernels/bfloat16.h"

namespace retort::kernels {

// bf16 (kernels/bfloat16.h): RMSNorm, SwiGLU and RoPE also read and write bf16 rows, computing
// in float32 (weights, RoPE tables and inv_rms float32): a bf16 stream in and out, or (RMSNorm)
// a float32 stream in and bf16 out, whose backward then takes a bf16 dy and gives a float32 dx.
void rms_norm_forward(const Bf16* x, const float* w, Bf16* y, float* inv_rms, int64_t rows,
                      int64_t n, double eps);
void rms_norm_forward(const float* x, const float* w, Bf16* y, float* inv_rms, int64_t rows,
                      int64_t n, double eps);
void rms_norm_backward(const Bf16* dy, const Bf16* x, const float* w, const float* inv_rms,
                       Bf16* dx, float* dw_partial, int64_t rows, int64_t n);
void rms_norm_backward(const Bf16* dy, const float* x, const float* w, const float* inv_rms,
                       float* dx, float* dw_partial, int64_t rows, int64_t n);
void swiglu_forward(const Bf16* gate_up, Bf16* out, int64_t rows, int64_t n);
void swiglu_backward(const Bf16* dy, const Bf16* gate_up, Bf16* d_gate_up, int64_t rows, int64_t n);
void rope_rotate(Bf16* x, const float* cos, const float* sin, int64_t row_begin, int64_t row_end,
                 int64_t row_stride, int64_t seq_len, int64_t heads, int64_t d, bool inverse);

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

// Softmax cross-entropy of rows of logits z alone on the vocabulary (no TP split), in place:
// rows of `cols` values, row r at z + r * stride, of which [0, real) are real and the rest
// padding. Per row: max_out[r], sum_out[r] = sum over real columns of exp(z - max), and
// loss[r] = log(sum) + max - z[target[r]] (target -1: no target, loss 0). With `scale`
// non-null, z becomes the gradient scale[r] * (softmax - onehot(target)), padding 0;
// otherwise z is left holding exp(z - max) on the real columns. The row is read once for the
// max and once for the rest, while it sits in cache.
void cross_entropy_rows(float* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                        const int64_t* target, float* max_out, float* sum_out, float* loss,
                        const float* scale);
void cross_entropy_rows(double* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                        const int64_t* target, double* max_out, double* sum_out, double* loss,
                        const double* scale);
// The gradient cross_entropy_rows forms, formed again from logits z and each row's saved max
// and sum (for a block of vocabulary columns: `real` of its `cols` are real, target the
// column within the block or -1), with the same operations, so the values are the same bit
// for bit: z = scale * exp(z - max) / sum - scale * onehot(target), padding 0.
void softmax_gradient_rows(float* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                           const float* max, const float* sum, const float* scale,
                           const int64_t* target);
void softmax_gradient_rows(double* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                           const double* max, const double* sum, const double* scale,
                           const int64_t* target);
// Both on bf16 logits: max, sum, loss and scale in float32, the computation in float32 on the
// widened logits, and the gradient rounded once to bf16: the float32 loops' result rounded, bit
// for bit. Without `scale`, cross_entropy_rows leaves bf16 logits as they were.
void cross_entropy_rows(Bf16* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                        const int64_t* target, float* max_out, float* sum_out, float* loss,
                        const float* scale);
void softmax_gradient_rows(Bf16* z, int64_t rows, int64_t cols, int64_t real, int64_t stride,
                           const float* max, const float* sum, const float* scale,
                           const int64_t* target);
}  // namespace retort::kernels
