// kernels/mixed_gemm.cpp: see mixed_gemm.h.
#include "kernels/mixed_gemm.h"

#include <dlfcn.h>

#include <stdexcept>

namespace retort::kernels {
namespace {

// cblas_gemm_bf16bf16f32(layout, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
// MKL_INT being int in the LP64 interface the wheel's MKL exports under this name.
using MixedGemmFn = void (*)(int, int, int, int, int, int, float, const uint16_t*, int,
                             const uint16_t*, int, float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

MixedGemmFn lookup() {
  static const MixedGemmFn fn =
      reinterpret_cast<MixedGemmFn>(dlsym(RTLD_DEFAULT, "cblas_gemm_bf16bf16f32"));
  return fn;
}

}  // namespace

bool bf16_gemm_f32_available() {
  return lookup() != nullptr;
}

void bf16_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const Bf16* a, int64_t lda, const Bf16* b, int64_t ldb, float beta, float* c,
                   int64_t ldc) {
  const MixedGemmFn fn = lookup();
  if (!fn) throw std::logic_error("bf16_gemm_f32: no cblas_gemm_bf16bf16f32 in this process");
  constexpr int64_t kMax = 0x7FFFFFFF;  // LP64: every size and stride an int
  if (m > kMax || n > kMax || k > kMax || lda > kMax || ldb > kMax || ldc > kMax)
    throw std::length_error("bf16_gemm_f32: a size or stride exceeds the BLAS's int");
  fn(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, int(m), int(n), int(k),
     alpha, reinterpret_cast<const uint16_t*>(a), int(lda), reinterpret_cast<const uint16_t*>(b),
     int(ldb), beta, c, int(ldc));
}

}  // namespace retort::kernels
