// Helpers shared by the scalar and SIMD kernels of kernels/cpu (not part of
// the component's public interface).
#pragma once

#include <cstddef>
#include <cstdint>

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
