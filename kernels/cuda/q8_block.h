// Quantizing 32-element blocks of activations for matmul_q8 (see
// Q8Activations in ops.h) from the registers of the lanes that hold them:
// kVec consecutive elements per lane, 32 / kVec lanes per block. Shared by
// quantize_q8 and the kernels that write their output quantized as well
// (rms_norm, add_rms_norm, silu_mul). Include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_util.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda::detail {

constexpr int kQ8Block = 32;  // activations per block

// v: this lane's kVec elements, from element `first` on (a multiple of kVec;
// the block's lanes are aligned neighbours): d = max|x| / 127,
// q = round(x / d), s = d·Σq. Every lane holding part of the block must
// call (the other lanes of the warp need not).
template <int kVec>
__device__ __forceinline__ void quantize_lanes_q8(const float (&v)[kVec], int64_t first, const Q8Activations& out) {
  constexpr int kLanes = kQ8Block / kVec;
  unsigned group = kFullMask;  // the block's lanes
  if constexpr (kLanes < kWarpSize) group = ((1u << kLanes) - 1) << (threadIdx.x % kWarpSize / kLanes * kLanes);
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < kVec; ++e) amax = fmaxf(amax, fabsf(v[e]));
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(group, amax, offset));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  uint32_t packed = 0;
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    const int q = __float2int_rn(v[e] * inv);
    sum += q;
    packed |= uint32_t(uint8_t(int8_t(q))) << (8 * e);
  }
  if constexpr (kVec == 4) {
    *reinterpret_cast<uint32_t*>(out.q + first) = packed;
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) out.q[first + e] = int8_t(uint8_t(packed >> (8 * e)));
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(group, sum, offset);
  if (first % kQ8Block == 0) {  // |Σq| <= 32·127: exact in f32
    const float d = amax / 127.0f;
    out.d[first / kQ8Block] = d;
    out.s[first / kQ8Block] = d * float(sum);
  }
}

}  // namespace lazykv::cuda::detail
