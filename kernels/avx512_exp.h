// kernels/avx512_exp.h: exp of floats in AVX-512 registers, for kernels written with
// intrinsics (the attention's softmax passes, kernels/attention_kernels.cpp). The reduction is
// x = (n + j/32) ln2 + r with |r| <= ln2/64: k = n + j/32 comes from one fused multiply-add
// that rounds x log2(e) to a 1/32 (its low five mantissa bits are j), 2^(j/32) from a
// 32-entry table held in two registers (vpermt2ps), e^r from a cubic, and 2^n is applied by
// vscalefps. Against Cephes' form (kernels/vector_exp.h: |r| <= ln2/2, a degree-7 polynomial,
// kept there for the portable loops) that is 7 instead of 11 operations on the FMA pipes, which
// bound it: a row pass over a 128 x 512 score tile ran 0.120 -> 0.097 ns a value on the Zen 5.
// Accuracy: within 1.9 half-ulp units over [-87, 8] (Cephes' 1.2; the test allows 4). Inputs
// below -87 are raised to it (e^-87 ~ 1.6e-38, as vector_exp), so no denormal is produced;
// large ones overflow to +inf. exp_avx512 takes N vectors and runs the steps across all of them
// in turn: one exp is a chain of dependent 4-cycle steps, so a lone one waits on latency; N
// side by side keep the FMA pipes busy.
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
  // 2^(j/32), j = 0..31, in two registers for vpermt2ps.
  const __m512 table_lo = _mm512_setr_ps(
      1.0f, 1.0218971486541166f, 1.0442737824274138f, 1.0671404006768237f, 1.0905077326652577f,
      1.1143867425958924f, 1.1387886347566916f, 1.1637248587775775f, 1.189207115002721f,
      1.215247359980469f, 1.241857812073484f, 1.2690509571917332f, 1.2968395546510096f,
      1.3252366431597413f, 1.3542555469368927f, 1.383909881963832f);
  const __m512 table_hi = _mm512_setr_ps(
      1.4142135623730951f, 1.4451808069770467f, 1.4768261459394993f, 1.5091644275934228f,
      1.5422108254079407f, 1.5759808451078865f, 1.6104903319492543f, 1.645755478153965f,
      1.681792830507429f, 1.718619298122478f, 1.7562521603732995f, 1.7947090750031072f,
      1.8340080864093424f, 1.8741676341103f, 1.9152065613971474f, 1.9571441241754002f);
  __m512 k[N], r[N], t[N];
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) {
    x[i] = _mm512_max_ps(x[i], _mm512_set1_ps(-87.0f));
    // y = x log2(e) + 1.5 * 2^18 rounds x log2(e) to the nearest 1/32 (y's last mantissa bit),
    // so k = y - 1.5 * 2^18 = n + j/32 exactly, and j is y's low five bits, which vpermt2ps
    // reads as the table index (n, its floor, may be negative: j stays k's fraction in 32nds)
    const __m512 y =
        _mm512_fmadd_ps(x[i], _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(393216.0f));
    k[i] = _mm512_sub_ps(y, _mm512_set1_ps(393216.0f));
    t[i] = _mm512_permutex2var_ps(table_lo, _mm512_castps_si512(y), table_hi);
  }
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) r[i] = _mm512_fnmadd_ps(k[i], _mm512_set1_ps(0.693359375f), x[i]);
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) r[i] = _mm512_fnmadd_ps(k[i], _mm512_set1_ps(-2.12194440e-4f), r[i]);
  // e^r = 1 + r q, q = 1 + r (1/2 + r/6): |r| <= ln2/64, the r^4 term below 6e-10
  __m512 q[N];
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i)
    q[i] = _mm512_fmadd_ps(r[i], _mm512_set1_ps(1.0f / 6.0f), _mm512_set1_ps(0.5f));
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) q[i] = _mm512_fmadd_ps(q[i], r[i], _mm512_set1_ps(1.0f));
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) r[i] = _mm512_mul_ps(r[i], t[i]);
    // 2^(j/32) e^r = t + (t r) q, then 2^n by vscalefps (which takes floor(k) = n)
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) x[i] = _mm512_scalef_ps(_mm512_fmadd_ps(r[i], q[i], t[i]), k[i]);
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
