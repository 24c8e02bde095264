// y = x · Wᵀ straight from the quantized weights, f32 activations. Decode and
// small batches are memory-bound on the weights, so each weight byte is read
// once per pass: one warp per output row, its lanes on consecutive 32-element
// blocks (the warp streams a contiguous span of the row), each decoded block
// applied to up to kTokens activation rows held in registers.
#include <cstdint>

#include "kernels/cuda/block_formats.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {
namespace {

using namespace detail;

constexpr int kWarpsPerBlock = 4;
constexpr int kTokens = 8;  // activation rows per pass over the weights

// x[0..31] of one activation block as 8 float4 loads.
__device__ __forceinline__ void load_x32(const float* x, float (&v)[32]) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 f = x4[i];
    v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
  }
}

// w[0..31] · x[0..31]; also Σx into x_sum (Q4_1's offset term).
__device__ __forceinline__ float dot32(const float (&w)[32], const float* x, bool x_aligned, float& x_sum) {
  float v[32];
  if (x_aligned) {
    load_x32(x, v);
  } else {
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = x[j];
  }
  float sum = 0.0f, total = 0.0f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    sum = fmaf(w[j], v[j], sum);
    total += v[j];
  }
  x_sum = total;
  return sum;
}

// Q4_1 block (20 bytes, 4-byte aligned in a 4-byte aligned row): d and m in
// the first word, 16 bytes of nibbles in the next four. w = d*q + m, so
// w·x = d*(q·x) + m*Σx.
__device__ __forceinline__ void accumulate_q4_1(const uint8_t* block, const float* x, int64_t cols, int n_tok,
                                                bool x_aligned, float (&acc)[kTokens]) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(block);
  const uint32_t dm = words[0];
  const float d = f16_bits_to_float(static_cast<uint16_t>(dm & 0xFFFF));
  const float m = f16_bits_to_float(static_cast<uint16_t>(dm >> 16));
  float q[32];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t packed = words[1 + w];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (packed >> (8 * b)) & 0xFF;
      q[4 * w + b] = static_cast<float>(byte & 0x0F);
      q[4 * w + b + 16] = static_cast<float>(byte >> 4);
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t < n_tok) {
      float x_sum;
      const float qx = dot32(q, x + t * cols, x_aligned, x_sum);
      acc[t] += d * qx + m * x_sum;
    }
  }
}

// Q8_0 block (34 bytes, 2-byte aligned): d then 32 int8 read as 16 halfwords.
__device__ __forceinline__ void accumulate_q8_0(const uint8_t* block, const float* x, int64_t cols, int n_tok,
                                                bool x_aligned, float (&acc)[kTokens]) {
  const uint16_t* halves = reinterpret_cast<const uint16_t*>(block);
  const float d = f16_bits_to_float(halves[0]);
  float q[32];
#pragma unroll
  for (int h = 0; h < 16; ++h) {
    const uint16_t pair = halves[1 + h];
    q[2 * h] = static_cast<float>(static_cast<int8_t>(pair & 0xFF));
    q[2 * h + 1] = static_cast<float>(static_cast<int8_t>(pair >> 8));
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t < n_tok) {
      float x_sum;  // unused: Q8_0 has no offset
      acc[t] += d * dot32(q, x + t * cols, x_aligned, x_sum);
    }
  }
}

template <DType kType>
__global__ void matmul_block_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
                                    const float* __restrict__ x, int64_t batch, float* __restrict__ y) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // whole warps leave together
  const int64_t t0 = int64_t(blockIdx.y) * kTokens;
  const int n_tok = static_cast<int>(batch - t0 < kTokens ? batch - t0 : kTokens);
  constexpr int kBlockBytes = kType == DType::kQ4_1 ? kQ4_1Bytes : kQ8_0Bytes;
  const int64_t n_blocks = cols / cpu::kQK;
  const uint8_t* w_row = w + row * n_blocks * kBlockBytes;
  const float* x0 = x + t0 * cols;
  const bool x_aligned = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && cols % 4 == 0;

  float acc[kTokens] = {};
  for (int64_t b = lane; b < n_blocks; b += kWarpSize) {
    if constexpr (kType == DType::kQ4_1) {
      accumulate_q4_1(w_row + b * kBlockBytes, x0 + b * cpu::kQK, cols, n_tok, x_aligned, acc);
    } else {
      accumulate_q8_0(w_row + b * kBlockBytes, x0 + b * cpu::kQK, cols, n_tok, x_aligned, acc);
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t < n_tok) {
      const float sum = warp_sum(acc[t]);
      if (lane == 0) y[(t0 + t) * rows + row] = sum;
    }
  }
}

// F16 rows: lanes take 8 consecutive halves (one 16-byte load) when rows are
// 16-byte aligned, else single halves; either way the warp reads a
// contiguous span.
__global__ void matmul_f16_kernel(const uint16_t* __restrict__ w, int64_t rows, int64_t cols,
                                  const float* __restrict__ x, int64_t batch, float* __restrict__ y, bool vectorized) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * kTokens;
  const int n_tok = static_cast<int>(batch - t0 < kTokens ? batch - t0 : kTokens);
  const uint16_t* w_row = w + row * cols;
  const float* x0 = x + t0 * cols;

  float acc[kTokens] = {};
  if (vectorized) {  // cols % 8 == 0, w and x 16-byte aligned
    for (int64_t k = 8 * int64_t(lane); k < cols; k += 8 * kWarpSize) {
      const uint4 packed = *reinterpret_cast<const uint4*>(w_row + k);
      const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
      float wf[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
        wf[2 * i] = pair.x;
        wf[2 * i + 1] = pair.y;
      }
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t < n_tok) {
          const float4* xt = reinterpret_cast<const float4*>(x0 + t * cols + k);
          const float4 a = xt[0], b = xt[1];
          acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                    wf[6] * b.z + wf[7] * b.w;
        }
      }
    }
  } else {
    for (int64_t k = lane; k < cols; k += kWarpSize) {
      const float wk = f16_bits_to_float(w_row[k]);
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t < n_tok) acc[t] = fmaf(wk, x0[t * cols + k], acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t < n_tok) {
      const float sum = warp_sum(acc[t]);
      if (lane == 0) y[(t0 + t) * rows + row] = sum;
    }
  }
}

}  // namespace

bool matmul_supported(DType type) {
  return type == DType::kF16 || type == DType::kQ4_1 || type == DType::kQ8_0;
}

void matmul(const WeightMatrix& w, const float* x, int64_t batch, float* y, cudaStream_t stream) {
  require(matmul_supported(w.type), "cuda::matmul: unsupported weight type");
  require(w.rows >= 0 && w.cols > 0 && batch >= 0, "cuda::matmul: bad shape");
  require(static_cast<size_t>(w.cols) % dtype_traits(w.type).block_elems == 0,
          "cuda::matmul: cols is not a multiple of the block size");
  require(reinterpret_cast<uintptr_t>(w.data) % 4 == 0, "cuda::matmul: weights must be 4-byte aligned");
  require(reinterpret_cast<uintptr_t>(x) % 4 == 0, "cuda::matmul: activations must be 4-byte aligned");
  if (w.rows == 0 || batch == 0) return;
  const int64_t row_blocks = (w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t token_blocks = (batch + kTokens - 1) / kTokens;
  require(row_blocks < (int64_t(1) << 31) && token_blocks < 65536, "cuda::matmul: shape too large");
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(token_blocks));
  const dim3 block(kWarpsPerBlock * kWarpSize);
  const auto* bytes = static_cast<const uint8_t*>(w.data);
  switch (w.type) {
    case DType::kQ4_1:
      matmul_block_kernel<DType::kQ4_1><<<grid, block, 0, stream>>>(bytes, w.rows, w.cols, x, batch, y);
      break;
    case DType::kQ8_0:
      matmul_block_kernel<DType::kQ8_0><<<grid, block, 0, stream>>>(bytes, w.rows, w.cols, x, batch, y);
      break;
    default: {
      const bool vectorized = w.cols % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                              reinterpret_cast<uintptr_t>(x) % 16 == 0;
      matmul_f16_kernel<<<grid, block, 0, stream>>>(static_cast<const uint16_t*>(w.data), w.rows, w.cols, x, batch,
                                                    y, vectorized);
      break;
    }
  }
  LAZYKV_CUDA_CHECK_LAUNCH();
}

}  // namespace lazykv::cuda
