// Helpers shared by the scalar and SIMD kernels of kernels/cpu (not part of
// the component's public interface).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"

// Shared with the CUDA block decoders (kernels/cuda/block_formats.h).
#if defined(__CUDACC__)
#define LAZYKV_HOST_DEVICE __host__ __device__
#else
#define LAZYKV_HOST_DEVICE
#endif

namespace lazykv::cpu {

// The 6-bit scale and min of sub-block j (0..7) from Q4_K's 12 packed bytes:
// bytes 0..3 hold scales 0..3 (low 6 bits), bytes 4..7 mins 0..3, bytes 8..11
// the low nibbles of scales/mins 4..7 whose top 2 bits ride in bytes 0..7.
LAZYKV_HOST_DEVICE inline void q4k_scale_min(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// A Q4_K super-block's 8 six-bit scales and mins, unpacked from the 12
// packed bytes: scales 0-3 and mins 0-3 are the low 6 bits of bytes 0-3 and
// 4-7; scales and mins 4-7 take their low 4 bits from bytes 8-11 (low and
// high nibble) and their top 2 bits from the top of bytes 0-3 and 4-7.
inline void q4k_scales_mins(const uint8_t* packed, uint8_t* scales, uint8_t* mins) {
  uint32_t a, b, c;
  std::memcpy(&a, packed, 4);
  std::memcpy(&b, packed + 4, 4);
  std::memcpy(&c, packed + 8, 4);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kTop2 = 0xc0c0c0c0;
  const uint32_t words[4] = {a & kLow6, (c & kLow4) | ((a & kTop2) >> 2), b & kLow6,
                             ((c >> 4) & kLow4) | ((b & kTop2) >> 2)};
  std::memcpy(scales, words, 8);
  std::memcpy(mins, words + 2, 8);
}

namespace simd {

// The SIMD dot product for this build's ISA; false when there is none for
// `weight_type` (the caller then uses vec_dot_scalar).
bool vec_dot(DType weight_type, int64_t n, const void* weight_row, const void* act_row, float& result);

// Register-tiled dot products for the 32-element block formats (Q4_0, Q4_1,
// Q8_0) and the K-quants (Q4_K, Q6_K): `rows` (1..kTileRows) weight rows
// against `tokens` (1..kTileTokens) activation rows, each weight block
// loaded (and a K-quant block unpacked) once per tile.
// y[t * y_stride + r] = dot(weight row r, activation row t).
constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;
bool has_dot_tile(DType weight_type);
void dot_tile(DType weight_type, int64_t n, const uint8_t* weights, size_t weight_stride, int rows,
              const uint8_t* acts, size_t act_stride, int tokens, float* y, size_t y_stride);

}  // namespace simd
}  // namespace lazykv::cpu
