// Device-side helpers shared by the .cu files of the CUDA backend (not part
// of its public interface; include only from .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/error.h"

namespace lazykv::cuda::detail {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over the whole block, returned to every thread. blockDim.x must be a
// multiple of 32; scratch: __shared__ float[32]. Safe to call repeatedly.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / kWarpSize;
  return warp_sum(lane < n_warps ? scratch[lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / kWarpSize;
  return warp_max(lane < n_warps ? scratch[lane] : -INFINITY);
}

__device__ __forceinline__ float f16_bits_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// An f16 stored at a 2-byte aligned address inside a byte buffer.
__device__ __forceinline__ float load_f16(const uint8_t* p) {
  return f16_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
}

// x as f16 for the tensor cores, saturating at ±65504 (one outlier must not
// turn a whole product into inf); NaN stays NaN.
__device__ __forceinline__ __half saturate_to_f16(float x) {
  return __float2half_rn(x != x ? x : fminf(fmaxf(x, -65504.0f), 65504.0f));
}

// Blocks for a 1-D launch of n threads, capped: kernels loop grid-stride.
inline unsigned grid_for(int64_t n, int block) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

inline void require(bool ok, const char* message) {
  if (!ok) throw Error(ErrorCode::kInvalidArgument, message);
}

}  // namespace lazykv::cuda::detail
