// engine/teacher_cache/half_float.h: IEEE 754 binary16 (float16) from and to float32, round to
// nearest even, torch-free. The teacher cache stores log-probabilities in it: 10 mantissa bits
// where bfloat16 has 7, so a log-probability near 0 (the likely tokens, which weigh most in a
// KL) keeps about 3 significant digits; its range (down to -65504) holds any log-probability.
#pragma once
#include <cstdint>
#include <cstring>

namespace retort::engine {

inline uint16_t float_to_half(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // inf, or NaN (kept quiet)
    return uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  if (abs < 0x38800000u) {                                  // below 2^-14: a subnormal half (or 0)
    if (abs < 0x33000000u) return uint16_t(sign);           // below half the smallest subnormal
    // value = mantissa x 2^(exponent - 150); in units of 2^-24, mantissa >> (126 - exponent).
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const int drop = 126 - int(abs >> 23);  // 14..24
    const uint32_t kept = mantissa >> drop;
    const uint32_t rest = mantissa & ((1u << drop) - 1);
    const uint32_t halfway = 1u << (drop - 1);
    const uint32_t round = rest > halfway || (rest == halfway && (kept & 1u));
    return uint16_t(sign | (kept + round));
  }
  const uint32_t rebased = abs - (112u << 23);  // exponent bias 127 -> 15
  const uint32_t kept = rebased >> 13, rest = rebased & 0x1fffu;
  const uint32_t round = rest > 0x1000u || (rest == 0x1000u && (kept & 1u));
  return uint16_t(sign | (kept + round));  // a carry into the exponent is the right result
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, x;
  if (exponent == 0x1f) {
    x = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    x = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    x = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      --exponent;
    }
    x = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &x, 4);
  return value;
}

}  // namespace retort::engine
