// kernels/mixed_gemm.h: C (float32) = alpha op(A) op(B) + beta C with A and B bf16, row-major:
// MKL's cblas_gemm_bf16bf16f32, looked up at run time in the library libtorch loads (the
// PyPI wheel's MKL exports it). One call forms a bf16 product in float32 and adds it into a
// float32 sum, where ATen has no mixed-type product on the CPU and would form a bf16 product,
// then a float32 copy of it, then add. Absent (another BLAS): available() is false and callers
// take ATen's way.
#pragma once
#include <cstdint>

#include "kernels/bfloat16.h"

namespace retort::kernels {

bool bf16_gemm_f32_available();

// op(A) is A [m, k] (lda >= k) or, transposed, A stored [k, m] (lda >= m); op(B) likewise
// [k, n] or stored [n, k]; C [m, n] with ldc >= n.
void bf16_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb, float beta, float* c,
                   int64_t ldc);

}  // namespace retort::kernels
