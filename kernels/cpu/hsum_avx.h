// Horizontal sums of 8 floats (and of 16 on AVX-512), for the SIMD kernels
// (simd_dot.cc, kquant_rows.cc, matmul_f32.cc, ops.cc): the one way to add a
// vector's lanes, so every kernel sums them in the same order. Include only
// where __AVX2__ is defined. (Not _mm512_reduce_add_ps: GCC 12 flags its own
// header as uninitialized.)
// Internal to kernels/cpu.
#pragma once

#include <immintrin.h>

namespace lazykv::cpu {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#if defined(__AVX512F__)
// (The upper half through the f64 extract: the f32 one needs AVX512DQ.)
inline float hsum(__m512 v) {
  const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), upper));
}
#endif

}  // namespace lazykv::cpu
