// The tiled weight layout of ops.h (WeightMatrix) on the device: its shape
// arithmetic and each type's decoder of one lane's 16-byte chunk. Shared by
// the decode matmul (matmul.cu) and the tensor-core GEMM's dequantization
// (gemm.cu); include from .cu files only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/error.h"
#include "kernels/cuda/block_formats.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda::detail {

constexpr int kTileRows = 32;     // a warp's rows: one per lane
constexpr int kChunkBytes = 16;   // one 128-bit load per lane
constexpr int kTileChunkBytes = kTileRows * kChunkBytes;

// One lane's 16-byte chunk in two parts: raw() gives its kElems quants as
// exact floats with the block's offset taken away (Q8_0: q - 128 of the
// biased byte, Q4_0: q - 8, Q4_1: q; F16/BF16 the values), and the scale
// entry of their block gives d and, for Q4_1, m: w = d·raw + m. The decode
// matmul sums raw·x over a chunk and scales once (d·Σraw·x + m·Σx), where
// decode() gives each weight.
template <DType kType>
struct TiledFormat;

// F16 and BF16: 8 halves per chunk, no scales.
template <DType kType>
struct HalfFormat {
  static constexpr int kElems = 8, kScaleBytes = 0;
  static constexpr bool kHasMin = false;
  __device__ static float widen(uint32_t bits) {
    if constexpr (kType == DType::kF16) return f16_bits_to_float(static_cast<uint16_t>(bits));
    return bf16_bits_to_float(static_cast<uint16_t>(bits));
  }
  __device__ static void raw(uint4 q, float (&w)[kElems]) {
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = widen(words[i] & 0xFFFF);
      w[2 * i + 1] = widen(words[i] >> 16);
    }
  }
  __device__ static float d(uint32_t) { return 1.0f; }
  __device__ static float m(uint32_t) { return 0.0f; }
};

template <>
struct TiledFormat<DType::kF16> : HalfFormat<DType::kF16> {};
template <>
struct TiledFormat<DType::kBF16> : HalfFormat<DType::kBF16> {};

// Byte b (0..3) of `bytes` minus kOffset as a float, exactly, for bytes below
// 2^23: the byte under the exponent of 2^23 (one byte permute), then 2^23 +
// kOffset taken away in one subtraction. Full-rate ALU work, where an
// int-to-float conversion runs at a quarter of the rate and bounds a 4-bit
// decode below the memory's speed.
template <int b, int kOffset = 0>
__device__ __forceinline__ float byte_as_float(uint32_t bytes) {
  return __uint_as_float(__byte_perm(bytes, 0x4B000000u, 0x7540 | b)) - (8388608.0f + float(kOffset));
}

// The four low (kHigh false) or high nibbles of a word, minus kOffset, as floats.
template <bool kHigh, int kOffset>
__device__ __forceinline__ void nibbles_as_floats(uint32_t word, float* out) {
  const uint32_t nibbles = (kHigh ? word >> 4 : word) & 0x0F0F0F0Fu;
  out[0] = byte_as_float<0, kOffset>(nibbles);
  out[1] = byte_as_float<1, kOffset>(nibbles);
  out[2] = byte_as_float<2, kOffset>(nibbles);
  out[3] = byte_as_float<3, kOffset>(nibbles);
}

// The 32 nibbles of a 4-bit block minus kOffset as floats: byte j holds
// element j (low nibble) and j + 16 (high).
template <int kOffset>
__device__ __forceinline__ void block_nibbles_as_floats(uint4 q, float (&w)[32]) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    nibbles_as_floats<false, kOffset>(words[i], &w[4 * i]);
    nibbles_as_floats<true, kOffset>(words[i], &w[16 + 4 * i]);
  }
}

__device__ __forceinline__ float scale_low_half(uint32_t scale) {
  return f16_bits_to_float(static_cast<uint16_t>(scale & 0xFFFF));
}

// Half a Q8_0 block: 16 int8 scaled by the block's f16 d (biased to
// unsigned bytes, q + 128, for byte_as_float).
template <>
struct TiledFormat<DType::kQ8_0> {
  static constexpr int kElems = 16, kScaleBytes = 2;
  static constexpr bool kHasMin = false;
  __device__ static void raw(uint4 q, float (&w)[kElems]) {
    const uint32_t words[4] = {q.x ^ 0x80808080u, q.y ^ 0x80808080u, q.z ^ 0x80808080u, q.w ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[4 * i] = byte_as_float<0, 128>(words[i]);
      w[4 * i + 1] = byte_as_float<1, 128>(words[i]);
      w[4 * i + 2] = byte_as_float<2, 128>(words[i]);
      w[4 * i + 3] = byte_as_float<3, 128>(words[i]);
    }
  }
  __device__ static float d(uint32_t scale) { return scale_low_half(scale); }
  __device__ static float m(uint32_t) { return 0.0f; }
};

// A whole Q4_0 block: w = d·(q - 8).
template <>
struct TiledFormat<DType::kQ4_0> {
  static constexpr int kElems = 32, kScaleBytes = 2;
  static constexpr bool kHasMin = false;
  __device__ static void raw(uint4 q, float (&w)[kElems]) { block_nibbles_as_floats<8>(q, w); }
  __device__ static float d(uint32_t scale) { return scale_low_half(scale); }
  __device__ static float m(uint32_t) { return 0.0f; }
};

// A whole Q4_1 block: w = d·q + m, d and m the two halves of the scale entry.
template <>
struct TiledFormat<DType::kQ4_1> {
  static constexpr int kElems = 32, kScaleBytes = 4;
  static constexpr bool kHasMin = true;
  __device__ static void raw(uint4 q, float (&w)[kElems]) { block_nibbles_as_floats<0>(q, w); }
  __device__ static float d(uint32_t scale) { return scale_low_half(scale); }
  __device__ static float m(uint32_t scale) { return f16_bits_to_float(static_cast<uint16_t>(scale >> 16)); }
};

// Every weight of a chunk: w = d·raw + m.
template <DType kType>
__device__ __forceinline__ void decode_chunk(uint4 q, uint32_t scale, float (&w)[TiledFormat<kType>::kElems]) {
  using Format = TiledFormat<kType>;
  Format::raw(q, w);
  if constexpr (Format::kScaleBytes > 0) {
    const float d = Format::d(scale), m = Format::m(scale);
#pragma unroll
    for (int j = 0; j < Format::kElems; ++j) w[j] = Format::kHasMin ? fmaf(w[j], d, m) : w[j] * d;
  }
}

template <DType kType>
__device__ __forceinline__ uint32_t load_scale(const uint8_t* entry) {
  constexpr int kBytes = TiledFormat<kType>::kScaleBytes;
  if constexpr (kBytes == 4) return *reinterpret_cast<const uint32_t*>(entry);
  if constexpr (kBytes == 2) return *reinterpret_cast<const uint16_t*>(entry);
  return 0;
}

struct TiledShape {
  int64_t rows, cols, n_chunks, n_blocks, row_tiles;
};

template <DType kType>
TiledShape tiled_shape(int64_t rows, int64_t cols) {
  constexpr int kElems = TiledFormat<kType>::kElems;
  return {rows, cols, (cols + kElems - 1) / kElems, cols / cpu::kQK, (rows + kTileRows - 1) / kTileRows};
}

template <DType kType>
size_t tiled_bytes_of(int64_t rows, int64_t cols) {
  const TiledShape s = tiled_shape<kType>(rows, cols);
  const size_t scales = size_t(s.row_tiles) * size_t(s.n_blocks) * kTileRows * TiledFormat<kType>::kScaleBytes;
  return size_t(s.row_tiles) * size_t(s.n_chunks) * kTileChunkBytes + scales;
}

// Op<kType>::run(args...) for a type matmul reads.
template <template <DType> class Op, class... Args>
auto with_tiled_type(DType type, Args&&... args) {
  switch (type) {
    case DType::kF16: return Op<DType::kF16>::run(args...);
    case DType::kBF16: return Op<DType::kBF16>::run(args...);
    case DType::kQ8_0: return Op<DType::kQ8_0>::run(args...);
    case DType::kQ4_0: return Op<DType::kQ4_0>::run(args...);
    case DType::kQ4_1: return Op<DType::kQ4_1>::run(args...);
    default: throw Error(ErrorCode::kInvalidArgument, "cuda::matmul: unsupported weight type");
  }
}

}  // namespace lazykv::cuda::detail
