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

// The decoded form of one lane's chunk: kElems weights from 16 bytes and the
// scale entry of their block (scale plane entries are 0, 2 or 4 bytes).
template <DType kType>
struct TiledFormat;

// F16 and BF16: 8 halves per chunk, no scales.
template <DType kType>
struct HalfFormat {
  static constexpr int kElems = 8, kScaleBytes = 0;
  __device__ static float widen(uint32_t bits) {
    if constexpr (kType == DType::kF16) return f16_bits_to_float(static_cast<uint16_t>(bits));
    return bf16_bits_to_float(static_cast<uint16_t>(bits));
  }
  __device__ static void decode(uint4 q, uint32_t, float (&w)[kElems]) {
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = widen(words[i] & 0xFFFF);
      w[2 * i + 1] = widen(words[i] >> 16);
    }
  }
};

template <>
struct TiledFormat<DType::kF16> : HalfFormat<DType::kF16> {};
template <>
struct TiledFormat<DType::kBF16> : HalfFormat<DType::kBF16> {};

// Byte b (0..3) of `bytes` as a float, exactly, for values below 2^23:
// the byte under the exponent of 2^23 (one byte permute), then 2^23 taken
// away. Full-rate ALU work, where an int-to-float conversion runs at a
// quarter of the rate and bounds a 4-bit decode below the memory's speed.
template <int b>
__device__ __forceinline__ float byte_as_float(uint32_t bytes) {
  return __uint_as_float(__byte_perm(bytes, 0x4B000000u, 0x7540 | b)) - 8388608.0f;
}

// The four low (kHigh false) or high nibbles of a word as floats.
template <bool kHigh>
__device__ __forceinline__ void nibbles_as_floats(uint32_t word, float* out) {
  const uint32_t nibbles = (kHigh ? word >> 4 : word) & 0x0F0F0F0Fu;
  out[0] = byte_as_float<0>(nibbles);
  out[1] = byte_as_float<1>(nibbles);
  out[2] = byte_as_float<2>(nibbles);
  out[3] = byte_as_float<3>(nibbles);
}

// The 32 nibbles of a 4-bit block as floats: byte j holds element j (low
// nibble) and j + 16 (high).
__device__ __forceinline__ void block_nibbles_as_floats(uint4 q, float (&w)[32]) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    nibbles_as_floats<false>(words[i], &w[4 * i]);
    nibbles_as_floats<true>(words[i], &w[16 + 4 * i]);
  }
}

// Half a Q8_0 block: 16 int8 scaled by the block's f16 d (biased to
// unsigned bytes, q + 128, for byte_as_float).
template <>
struct TiledFormat<DType::kQ8_0> {
  static constexpr int kElems = 16, kScaleBytes = 2;
  __device__ static void decode(uint4 q, uint32_t scale, float (&w)[kElems]) {
    const float d = f16_bits_to_float(static_cast<uint16_t>(scale));
    const uint32_t words[4] = {q.x ^ 0x80808080u, q.y ^ 0x80808080u, q.z ^ 0x80808080u, q.w ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[4 * i] = d * (byte_as_float<0>(words[i]) - 128.0f);
      w[4 * i + 1] = d * (byte_as_float<1>(words[i]) - 128.0f);
      w[4 * i + 2] = d * (byte_as_float<2>(words[i]) - 128.0f);
      w[4 * i + 3] = d * (byte_as_float<3>(words[i]) - 128.0f);
    }
  }
};

// A whole Q4_0 block: w = d·(q - 8).
template <>
struct TiledFormat<DType::kQ4_0> {
  static constexpr int kElems = 32, kScaleBytes = 2;
  __device__ static void decode(uint4 q, uint32_t scale, float (&w)[kElems]) {
    const float d = f16_bits_to_float(static_cast<uint16_t>(scale));
    block_nibbles_as_floats(q, w);
#pragma unroll
    for (int j = 0; j < 32; ++j) w[j] = d * (w[j] - 8.0f);
  }
};

// A whole Q4_1 block: w = d·q + m, d and m the two halves of the scale entry.
template <>
struct TiledFormat<DType::kQ4_1> {
  static constexpr int kElems = 32, kScaleBytes = 4;
  __device__ static void decode(uint4 q, uint32_t scale, float (&w)[kElems]) {
    const float d = f16_bits_to_float(static_cast<uint16_t>(scale & 0xFFFF));
    const float m = f16_bits_to_float(static_cast<uint16_t>(scale >> 16));
    block_nibbles_as_floats(q, w);
#pragma unroll
    for (int j = 0; j < 32; ++j) w[j] = w[j] * d + m;
  }
};

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
