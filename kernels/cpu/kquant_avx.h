// SIMD pieces the K-quant kernels share (kquant_rows.cc, kquant_planes.cc):
// bytes widened to floats, and the tables that spread a Q4_K or Q6_K
// super-block's sub-block scales over the lanes of its 64-byte weight
// vectors. Include only where __AVX2__ is defined. Internal to kernels/cpu.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace lazykv::cpu {

// 8 unsigned (signed) bytes widened to 8 floats.
inline __m256 u8x8_to_float(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 s8x8_to_float(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

#if defined(__AVX512F__)
// Lane index tables for _mm512_permutexvar_ps: lane i of weight vector v
// (bytes 64v..64v+63 of the super-block's quants, unpacked) reads the scale
// of sub-block first[v] + (i / lanes_per_sub_block) · step.
struct ScaleLanes {
  alignas(64) int idx[4][16];
  constexpr ScaleLanes(int lanes_per_sub_block, int step, const int (&first)[4]) : idx{} {
    for (int v = 0; v < 4; ++v) {
      for (int i = 0; i < 16; ++i) idx[v][i] = first[v] + (i / lanes_per_sub_block) * step;
    }
  }
  __m512i operator[](int v) const { return _mm512_load_si512(idx[v]); }
};
inline constexpr int kQ4kFirstSubBlock[4] = {0, 1, 4, 5};
inline constexpr int kQ6kFirstSubBlock[4] = {0, 4, 8, 12};
// Q4_K, vector 2h + n: half h's 64 bytes, low (n = 0) or high nibbles;
// lanes 0-7 are sub-block 4h + n, lanes 8-15 sub-block 4h + n + 2.
inline constexpr ScaleLanes kQ4kScaleLanes(8, 2, kQ4kFirstSubBlock);
// Q6_K, vector 2·half + n: elements 64n..64n+63 of the half, 4 lanes a sub-block of 16.
inline constexpr ScaleLanes kQ6kScaleLanes(4, 1, kQ6kFirstSubBlock);
#endif

}  // namespace lazykv::cpu
