// IEEE half and bfloat16 conversions (bit-exact, round to nearest even).
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace lazykv {

inline float bits_to_float(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

inline float fp16_to_fp32(uint16_t h) {
#if defined(__F16C__)
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
#else
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000 | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // subnormal: normalise
    int e = -1;
    do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
    mant &= 0x3ff;
    return bits_to_float(sign | uint32_t(127 - 15 - e) << 23 | (mant << 13));
  }
  return bits_to_float(sign | (exp + 127 - 15) << 23 | (mant << 13));
#endif
}

inline uint16_t fp32_to_fp16(float f) {
#if defined(__F16C__)
  return uint16_t(_mm_cvtsi128_si32(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT)));
#else
  const uint32_t x = float_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return uint16_t(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
  if (abs >= 0x477ff000) return uint16_t(sign | 0x7c00);  // overflow to inf
  if (abs < 0x38800000) {  // half subnormal or zero: units of 2^-24, round to even
    return uint16_t(sign | uint32_t(std::nearbyint(bits_to_float(abs) * 16777216.0f)));
  }
  uint32_t h = ((abs - 0x38000000) >> 13);
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return uint16_t(sign | h);
#endif
}

inline float bf16_to_fp32(uint16_t b) { return bits_to_float(uint32_t(b) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

}  // namespace lazykv
