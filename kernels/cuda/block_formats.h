// Device decoders for the GGML block formats, reading raw bytes at the
// offsets of the kernels/cpu block structs (checked below) with aligned 2-
// and 4-byte loads instead of the packed structs. Include from .cu only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h"
#include "kernels/cuda/device_util.h"

namespace lazykv::cuda::detail {

static_assert(offsetof(cpu::BlockQ4_0, qs) == 2 && offsetof(cpu::BlockQ4_1, m) == 2 &&
              offsetof(cpu::BlockQ4_1, qs) == 4 && offsetof(cpu::BlockQ8_0, qs) == 2 &&
              offsetof(cpu::BlockQ4_K, dmin) == 2 && offsetof(cpu::BlockQ4_K, scales) == 4 &&
              offsetof(cpu::BlockQ4_K, qs) == 16 && offsetof(cpu::BlockQ6_K, qh) == 128 &&
              offsetof(cpu::BlockQ6_K, scales) == 192 && offsetof(cpu::BlockQ6_K, d) == 208,
              "block layouts must match kernels/cpu/quant.h");

constexpr int kQ4_0Bytes = sizeof(cpu::BlockQ4_0);
constexpr int kQ4_1Bytes = sizeof(cpu::BlockQ4_1);
constexpr int kQ8_0Bytes = sizeof(cpu::BlockQ8_0);
constexpr int kQ4_KBytes = sizeof(cpu::BlockQ4_K);
constexpr int kQ6_KBytes = sizeof(cpu::BlockQ6_K);

// Element j (0..31) of a Q4_0 block: d * (q - 8); qs[j] low nibble holds
// element j, high nibble element j + 16.
__device__ __forceinline__ float decode_q4_0(const uint8_t* block, int j) {
  const uint8_t byte = block[2 + (j & 15)];
  const int q = j < 16 ? (byte & 0x0F) : (byte >> 4);
  return load_f16(block) * static_cast<float>(q - 8);
}

__device__ __forceinline__ float decode_q4_1(const uint8_t* block, int j) {
  const uint8_t byte = block[4 + (j & 15)];
  const int q = j < 16 ? (byte & 0x0F) : (byte >> 4);
  return load_f16(block) * static_cast<float>(q) + load_f16(block + 2);
}

__device__ __forceinline__ float decode_q8_0(const uint8_t* block, int j) {
  return load_f16(block) * static_cast<float>(static_cast<int8_t>(block[2 + j]));
}

using cpu::q4k_scale_min;  // one definition for host and device

// Element e (0..255) of a Q4_K super-block: 4 groups of 64 elements, each
// 32 bytes whose low nibbles are sub-block 2g and high nibbles 2g + 1.
__device__ __forceinline__ float decode_q4_k(const uint8_t* block, int e) {
  const int group = e / 64, high = (e / 32) & 1, l = e % 32;
  const uint8_t byte = block[16 + 32 * group + l];
  const int q = high ? (byte >> 4) : (byte & 0x0F);
  int scale, min;
  q4k_scale_min(2 * group + high, block + 4, scale, min);
  return load_f16(block) * static_cast<float>(scale) * static_cast<float>(q) -
         load_f16(block + 2) * static_cast<float>(min);
}

// Element e (0..255) of a Q6_K super-block: two halves of 128; within a half,
// quarter k/32 takes the low (quarters 0, 1) or high (2, 3) nibbles of ql and
// 2 bits of qh; 16 signed 8-bit scales, one per 16 elements.
__device__ __forceinline__ float decode_q6_k(const uint8_t* block, int e) {
  const int half = e / 128, l = e % 128, quarter = l / 32, k = l % 32;
  const uint8_t* ql = block + 64 * half;
  const uint8_t* qh = block + 128 + 32 * half;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192) + 8 * half;
  const uint8_t low = (quarter & 1) ? ql[k + 32] : ql[k];
  const int low4 = quarter < 2 ? (low & 0x0F) : (low >> 4);
  const int high2 = (qh[k] >> (2 * quarter)) & 3;
  const int q = (low4 | (high2 << 4)) - 32;
  const int sub = quarter * 2 + k / 16;
  return load_f16(block + 208) * static_cast<float>(scales[sub]) * static_cast<float>(q);
}

}  // namespace lazykv::cuda::detail
