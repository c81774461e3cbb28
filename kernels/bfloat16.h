// kernels/bfloat16.h: bfloat16 storage for the row loops: a 16-bit value that is the top half
// of a float32, widened exactly and narrowed by round-to-nearest-even (as c10::BFloat16 and
// the hardware's conversions do). The loops read and write bf16 and compute in float32; the
// widen/store pair below also passes float and double through unchanged, so one loop template
// serves every element type. Written as plain integer operations so GCC vectorises them.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/isa_variants.h"

namespace retort::kernels {

struct Bf16 {
  uint16_t bits;
};

RETORT_ALWAYS_INLINE float widen(Bf16 v) {
  const uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
RETORT_ALWAYS_INLINE float widen(float v) {
  return v;
}
RETORT_ALWAYS_INLINE double widen(double v) {
  return v;
}

RETORT_ALWAYS_INLINE Bf16 round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  // NaN stays a (quiet) NaN; everything else rounds to nearest, ties to even.
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return Bf16{uint16_t(nan ? ((u >> 16) | 0x40u) : rounded)};
}

RETORT_ALWAYS_INLINE void store(Bf16* p, float v) {
  *p = round_to_bf16(v);
}
RETORT_ALWAYS_INLINE void store(float* p, float v) {
  *p = v;
}
RETORT_ALWAYS_INLINE void store(double* p, double v) {
  *p = v;
}

}  // namespace retort::kernels
