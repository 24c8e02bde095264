// Quantized block formats (the GGML layouts, so GGUF tensors are used in
// place) and the row-level conversions and dot products on them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace lazykv::cpu {

constexpr int kQK = 32;    // elements per Q4_0/Q4_1/Q8_0/Q8_1 block
constexpr int kQK_K = 256; // elements per K-quant super-block

#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };            // x = d * (q - 8)
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[kQK / 2]; };// x = d * q + m
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };                 // x = d * q
struct BlockQ8_1 { uint16_t d; uint16_t s; int8_t qs[kQK]; };     // s = d * sum(q)
struct BlockQ4_K {                                                 // 8 sub-blocks of 32
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // 6-bit scales and mins, packed
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {                                                 // 16 sub-blocks of 16
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];  // sums of groups of 16 quants
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34 &&
              sizeof(BlockQ8_1) == 36 && sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210 &&
              sizeof(BlockQ8_K) == 292);

// src: [n] elements of `type`; dst: [n] floats. n is a multiple of the block size.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// src: [n] floats; dst: [row_bytes(type, n)] bytes. Supports every DType
// (K-quant weight quantizers are the simple reference ones, used to write test
// models; activations use Q8_0, Q8_1 and Q8_K).
void quantize_row(DType type, const float* src, void* dst, int64_t n);

// The format activations are converted to before a dot product with weights
// of `weight_type` (F32 for float weight types).
DType vec_dot_type(DType weight_type);

// Dot product of one weight row [n] of `weight_type` with one activation row
// [n] already in vec_dot_type(weight_type). Uses AVX-512/AVX2 when built for
// them.
float vec_dot(DType weight_type, int64_t n, const void* weight_row, const void* act_row);

// The portable scalar implementation of vec_dot, always compiled: the
// reference the SIMD paths are tested against and the fallback on other CPUs.
float vec_dot_scalar(DType weight_type, int64_t n, const void* weight_row, const void* act_row);

}  // namespace lazykv::cpu
