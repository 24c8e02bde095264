// Horizontal sum of 8 floats, for the AVX2 kernels (simd_dot.cc,
// kquant_rows.cc); include only where __AVX2__ is defined. Internal to
// kernels/cpu.
#pragma once

#include <immintrin.h>

namespace lazykv::cpu {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace lazykv::cpu
