// Normalisation, activation, RoPE and conversion kernels (cpu/ops.cc on the
// device). Accurate math functions (expf, sinf, cosf), never the fast
// intrinsics, so results track the CPU backend closely.
#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {
namespace {

using detail::block_sum;
using detail::grid_for;
using detail::require;

constexpr int kThreads = 256;

// One block per row; a row of a few thousand floats is one load per thread
// per pass (rms_norm launches up to 1024 threads), so decode's single row is
// two memory round trips, not one per 256 elements.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                float* __restrict__ y, int64_t n, float eps) {
  __shared__ float scratch[32];
  const float* row = x + blockIdx.x * n;
  float* out = y + blockIdx.x * n;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += row[i] * row[i];
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = row[i] * inv * weight[i];
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void add_rows_kernel(float* x, const float* __restrict__ bias, int64_t total, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] += bias[i % n];
  }
}

__global__ void to_f16_kernel(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = __half_as_ushort(__float2half_rn(x[i]));
  }
}

// One thread per rotated pair (token, head, i).
__global__ void rope_kernel(float* x, const int32_t* __restrict__ positions, const float* __restrict__ inv_freq,
                            int64_t n_tokens, int n_heads, int head_dim, int half, float mscale, bool interleaved) {
  const int64_t total = n_tokens * n_heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int64_t head = idx / half;  // token * n_heads + h
    const int64_t token = head / n_heads;
    const float theta = static_cast<float>(positions[token]) * inv_freq[i];
    const float c = cosf(theta) * mscale;
    const float s = sinf(theta) * mscale;
    float* v = x + head * head_dim;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = v[a];
    const float x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t n_rows, int64_t n, float eps,
              cudaStream_t stream) {
  require(n_rows >= 0 && n > 0, "rms_norm: bad shape");
  require(n_rows < (int64_t(1) << 31), "rms_norm: too many rows");
  if (n_rows == 0) return;
  const int64_t warps = std::min<int64_t>((n + detail::kWarpSize - 1) / detail::kWarpSize, 32);
  const int threads = static_cast<int>(std::max<int64_t>(warps, kThreads / detail::kWarpSize)) * detail::kWarpSize;
  rms_norm_kernel<<<static_cast<unsigned>(n_rows), threads, 0, stream>>>(x, weight, y, n, eps);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  require(n >= 0, "silu_mul: bad shape");
  if (n == 0) return;
  silu_mul_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(gate, up, out, n);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  require(n >= 0, "add_inplace: bad shape");
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void add_rows(float* x, const float* bias, int64_t n_rows, int64_t n, cudaStream_t stream) {
  require(n_rows >= 0 && n > 0, "add_rows: bad shape");
  if (n_rows == 0) return;
  add_rows_kernel<<<grid_for(n_rows * n, kThreads), kThreads, 0, stream>>>(x, bias, n_rows * n, n);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  require(n >= 0, "to_f16: bad shape");
  if (n == 0) return;
  to_f16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void rope(float* x, const int32_t* positions, const float* inv_freq, int64_t n_tokens, int n_heads, int head_dim,
          int n_rot, float mscale, RopeStyle style, cudaStream_t stream) {
  require(n_tokens >= 0 && n_heads > 0 && head_dim > 0, "rope: bad shape");
  require(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= head_dim, "rope: n_rot must be even and at most head_dim");
  const int half = n_rot / 2;
  const int64_t total = n_tokens * n_heads * half;
  if (total == 0) return;
  rope_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, positions, inv_freq, n_tokens, n_heads, head_dim,
                                                                  half, mscale, style == RopeStyle::kInterleaved);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

}  // namespace lazykv::cuda
