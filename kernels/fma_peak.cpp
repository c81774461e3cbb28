// kernels/fma_peak.cpp: see fma_peak.h. Twelve chains per ISA: AVX-512 and AVX2 have an FMA
// latency of 4 and two FMA ports on current cores, so eight chains already fill them; twelve
// (plus the two constants) still fit the register file of AVX2's 16 ymm. Without FMA
// (baseline x86-64) a multiply and an add per lane, also two operations.
#include "kernels/fma_peak.h"

#include "kernels/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RETORT_FMA_INTRINSICS 1
#endif

namespace retort::kernels {
namespace {

constexpr int kChains = 12;

#ifdef RETORT_FMA_INTRINSICS
__attribute__((target("avx512f"), noinline)) float chains_avx512(int64_t iterations) {
  __m512 acc[kChains];
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  for (int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  float lanes[16], total = 0;
  for (int i = 0; i < kChains; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    for (float lane : lanes) total += lane;
  }
  return total;
}

__attribute__((target("avx2,fma"), noinline)) float chains_avx2(int64_t iterations) {
  __m256 acc[kChains];
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(float(i));
  for (int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float lanes[8], total = 0;
  for (int i = 0; i < kChains; ++i) {
    _mm256_storeu_ps(lanes, acc[i]);
    for (float lane : lanes) total += lane;
  }
  return total;
}

__attribute__((noinline)) float chains_sse(int64_t iterations) {
  __m128 acc[kChains];
  const __m128 a = _mm_set1_ps(0.999f), b = _mm_set1_ps(1e-7f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm_set1_ps(float(i));
  for (int64_t it = 0; it < iterations; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], a), b);
  float lanes[4], total = 0;
  for (int i = 0; i < kChains; ++i) {
    _mm_storeu_ps(lanes, acc[i]);
    for (float lane : lanes) total += lane;
  }
  return total;
}
#endif

}  // namespace

double fma_chains(int64_t iterations, float* sink) {
#ifdef RETORT_FMA_INTRINSICS
  switch (kernel_isa()) {
    case Isa::avx512:
      *sink = chains_avx512(iterations);
      return double(iterations) * kChains * 16 * 2;
    case Isa::avx2:
      *sink = chains_avx2(iterations);
      return double(iterations) * kChains * 8 * 2;
    case Isa::baseline:
      *sink = chains_sse(iterations);
      return double(iterations) * kChains * 4 * 2;
  }
#endif
  float acc = 0;  // another architecture: one scalar chain, a lower bound of its peak
  for (int64_t it = 0; it < iterations; ++it) acc = acc * 0.999f + 1e-7f;
  *sink = acc;
  return double(iterations) * 2;
}

}  // namespace retort::kernels
