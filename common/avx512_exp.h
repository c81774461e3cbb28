// common/avx512_exp.h: exp of floats in AVX-512 registers, for kernels written with
// intrinsics (the attention's softmax passes, layers/attention_kernels.cpp). Cephes' reduction
// x = n ln2 + r, |r| <= ln2/2, and its polynomial for e^r, as in common/vector_exp.h, so the
// two agree to an ulp or so; but 2^n is applied by vscalefps instead of being built from
// exponent bits: twelve instructions, no integer conversions. Inputs below -87 are raised to it
// (e^-87 ~ 1.6e-38, as vector_exp), so no denormal is produced; large ones overflow to +inf.
// exp_avx512 takes N vectors and runs the steps across all of them in turn: one exp is a chain
// of a dozen dependent 4-cycle steps, so a lone one waits on latency; N side by side keep the
// FMA pipes busy.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

#define RETORT_AVX512_EXP 1

// GCC 12's intrinsics fill unused lanes from _mm512_undefined_ps(), which -Wall then reports as
// uninitialised wherever they are inlined; no lane of it is ever read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace retort::kernels {

template <int N>
__attribute__((target("avx512f"), always_inline)) inline void exp_avx512(__m512 (&x)[N]) {
  __m512 n[N], r[N], p[N];
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) {
    x[i] = _mm512_max_ps(x[i], _mm512_set1_ps(-87.0f));
    n[i] = _mm512_roundscale_ps(_mm512_mul_ps(x[i], _mm512_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) r[i] = _mm512_fnmadd_ps(n[i], _mm512_set1_ps(0.693359375f), x[i]);
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) r[i] = _mm512_fnmadd_ps(n[i], _mm512_set1_ps(-2.12194440e-4f), r[i]);
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i)
    p[i] =
        _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r[i], _mm512_set1_ps(1.3981999507e-3f));
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) p[i] = _mm512_fmadd_ps(p[i], r[i], _mm512_set1_ps(8.3334519073e-3f));
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) p[i] = _mm512_fmadd_ps(p[i], r[i], _mm512_set1_ps(4.1665795894e-2f));
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) p[i] = _mm512_fmadd_ps(p[i], r[i], _mm512_set1_ps(1.6666665459e-1f));
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) p[i] = _mm512_fmadd_ps(p[i], r[i], _mm512_set1_ps(5.0000001201e-1f));
    // e^r = 1 + r + r^2 p = 1 + r (1 + r p)
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) p[i] = _mm512_fmadd_ps(r[i], p[i], _mm512_set1_ps(1.0f));
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) p[i] = _mm512_fmadd_ps(p[i], r[i], _mm512_set1_ps(1.0f));
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) x[i] = _mm512_scalef_ps(p[i], n[i]);
}

// The n values at x (vectors of 16, the last one masked): x becomes exp(x - shift), 64 values
// (four exp chains) per step. Returns the sum of the new values when Sum.
template <bool Sum>
__attribute__((target("avx512f"), always_inline)) inline float exp_shifted_avx512(float* x,
                                                                                  int64_t n,
                                                                                  float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    __m512 v[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) v[i] = _mm512_sub_ps(_mm512_loadu_ps(x + j + 16 * i), s);
    exp_avx512(v);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      _mm512_storeu_ps(x + j + 16 * i, v[i]);
      if constexpr (Sum) sum = _mm512_add_ps(sum, v[i]);
    }
  }
  for (; j < n; j += 16) {
    const __mmask16 lanes = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    __m512 v[1] = {_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + j), s)};
    exp_avx512(v);
    _mm512_mask_storeu_ps(x + j, lanes, v[0]);
    if constexpr (Sum) sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(lanes, v[0]));
  }
  return Sum ? _mm512_reduce_add_ps(sum) : 0.0f;
}

}  // namespace retort::kernels

#pragma GCC diagnostic pop
#endif
