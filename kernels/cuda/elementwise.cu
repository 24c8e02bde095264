// Normalisation, activation, RoPE and conversion kernels (cpu/ops.cc on the
// device). Accurate math functions (expf, sinf, cosf), never the fast
// intrinsics, so results track the CPU backend closely.
#include <algorithm>
#include <initializer_list>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/q8_block.h"

namespace lazykv::cuda {
namespace {

using detail::block_sum;
using detail::grid_for;
using detail::require;

constexpr int kThreads = 256;

// kVec consecutive floats at p (kVec 4: 16-byte aligned, one load).
template <int kVec>
__device__ __forceinline__ void load_vec(const float* p, float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = p[e];
  }
}

template <int kVec>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) p[e] = v[e];
  }
}

// The norm of the row the block holds, kVec floats per thread and step, so
// decode's single row of a few thousand floats is one load per thread (up
// to 1024 threads): out = row·inv·weight, and with kQ8 also quantized (the
// row a multiple of 32 long, so each warp holds whole 32-element blocks).
template <int kVec, bool kQ8>
__device__ __forceinline__ void write_normed(const float* row, const float* __restrict__ weight, float sum,
                                             int64_t n, float eps, float* __restrict__ out, const Q8Activations& q8) {
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  for (int64_t i = int64_t(threadIdx.x) * kVec; i < n; i += int64_t(blockDim.x) * kVec) {
    float v[kVec], w[kVec];
    load_vec(row + i, v);
    load_vec(weight + i, w);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = v[e] * inv * w[e];
    store_vec(out + blockIdx.x * n + i, v);
    if constexpr (kQ8) detail::quantize_lanes_q8(v, blockIdx.x * n + i, q8);
  }
}

// One block per row: y = x / rms(x) · weight.
template <int kVec, bool kQ8>
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                float* __restrict__ y, int64_t n, float eps, Q8Activations q8) {
  __shared__ float scratch[32];
  const float* row = x + blockIdx.x * n;
  float sum = 0.0f;
  for (int64_t i = int64_t(threadIdx.x) * kVec; i < n; i += int64_t(blockDim.x) * kVec) {
    float v[kVec];
    load_vec(row + i, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum += v[e] * v[e];
  }
  write_normed<kVec, kQ8>(row, weight, block_sum(sum, scratch), n, eps, y, q8);
}

// rms_norm_kernel after x += y on the same row, in one pass over it: the
// residual add and the next norm of a layer (the same sums as rms_norm's).
template <int kVec, bool kQ8>
__global__ void add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ y,
                                    const float* __restrict__ weight, float* __restrict__ out, int64_t n, float eps,
                                    Q8Activations q8) {
  __shared__ float scratch[32];
  float* row = x + blockIdx.x * n;
  const float* add = y + blockIdx.x * n;
  float sum = 0.0f;
  for (int64_t i = int64_t(threadIdx.x) * kVec; i < n; i += int64_t(blockDim.x) * kVec) {
    float v[kVec], a[kVec];
    load_vec(row + i, v);
    load_vec(add + i, a);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      v[e] += a[e];
      sum += v[e] * v[e];
    }
    store_vec(row + i, v);
  }
  write_normed<kVec, kQ8>(row, weight, block_sum(sum, scratch), n, eps, out, q8);
}

template <bool kQ8>
__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n, Q8Activations q8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    const float v[1] = {g / (1.0f + expf(-g)) * up[i]};
    out[i] = v[0];
    if constexpr (kQ8) detail::quantize_lanes_q8(v, i, q8);
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

// Rotates pair i (< half) of one head at `pos`: dims (a, b) by the style.
__device__ __forceinline__ void rotate_pair(float* head, int i, int half, float pos, const float* __restrict__ inv_freq,
                                            float mscale, bool interleaved, uint16_t* head16) {
  const float theta = pos * inv_freq[i];
  const float c = cosf(theta) * mscale;
  const float s = sinf(theta) * mscale;
  const int a = interleaved ? 2 * i : i;
  const int b = interleaved ? 2 * i + 1 : i + half;
  const float x0 = head[a];
  const float x1 = head[b];
  head[a] = x0 * c - x1 * s;
  head[b] = x0 * s + x1 * c;
  if (head16 != nullptr) {
    head16[a] = __half_as_ushort(__float2half_rn(head[a]));
    head16[b] = __half_as_ushort(__float2half_rn(head[b]));
  }
}

// One thread per item of a layer's new Q, K and V rows: each head of Q and
// K has half rotated pairs then head_dim - n_rot unrotated dims (K's to f16
// as they are), each head of V head_dim dims to f16.
__global__ void rope_qk_to_f16_kernel(float* q, float* k, const float* __restrict__ v,
                                      const int32_t* __restrict__ positions, const float* __restrict__ inv_freq,
                                      int64_t n_tokens, int n_q_heads, int n_kv_heads, int head_dim, int n_rot,
                                      float mscale, bool interleaved, uint16_t* __restrict__ k16,
                                      uint16_t* __restrict__ v16) {
  const int half = n_rot / 2;
  const int per_head = head_dim - half;
  const int64_t q_items = n_tokens * n_q_heads * per_head, k_items = n_tokens * n_kv_heads * per_head;
  const int64_t total = q_items + k_items + n_tokens * n_kv_heads * head_dim;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    if (idx >= q_items + k_items) {
      const int64_t j = idx - q_items - k_items;
      v16[j] = __half_as_ushort(__float2half_rn(v[j]));
      continue;
    }
    const bool is_q = idx < q_items;
    const int64_t item = is_q ? idx : idx - q_items;
    const int64_t head = item / per_head;  // token * heads + h
    const int i = static_cast<int>(item % per_head);
    const int64_t token = head / (is_q ? n_q_heads : n_kv_heads);
    float* x = (is_q ? q : k) + head * head_dim;
    uint16_t* x16 = is_q ? nullptr : k16 + head * head_dim;
    if (i < half) {
      rotate_pair(x, i, half, static_cast<float>(positions[token]), inv_freq, mscale, interleaved, x16);
    } else if (x16 != nullptr) {
      const int d = n_rot + (i - half);
      x16[d] = __half_as_ushort(__float2half_rn(x[d]));
    }
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
    rotate_pair(x + head * head_dim, i, half, static_cast<float>(positions[token]), inv_freq, mscale, interleaved,
                nullptr);
  }
}

}  // namespace

namespace {

// A norm's launch: a block per row, threads for the row in steps of kVec
// floats (4 where the rows and the pointers allow 16-byte loads), 256 to
// 1024 of them.
struct NormLaunch {
  unsigned rows;
  int threads;
  bool vec4;
};

NormLaunch norm_launch(int64_t n_rows, int64_t n, const Q8Activations* q8, std::initializer_list<const void*> rows) {
  require(n_rows >= 0 && n > 0, "rms_norm: bad shape");
  require(n_rows < (int64_t(1) << 31), "rms_norm: too many rows");
  require(q8 == nullptr || n % detail::kQ8Block == 0, "rms_norm: a quantized output needs rows a multiple of 32 long");
  require(q8 == nullptr || reinterpret_cast<uintptr_t>(q8->q) % 16 == 0, "rms_norm: q8.q must be 16-byte aligned");
  bool vec4 = n % 4 == 0;
  for (const void* p : rows) vec4 = vec4 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  const int64_t steps = vec4 ? n / 4 : n;
  const int64_t warps = std::min<int64_t>((steps + detail::kWarpSize - 1) / detail::kWarpSize, 32);
  const int threads = static_cast<int>(std::max<int64_t>(warps, kThreads / detail::kWarpSize)) * detail::kWarpSize;
  return {static_cast<unsigned>(n_rows), threads, vec4};
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t n_rows, int64_t n, float eps,
              cudaStream_t stream, const Q8Activations* q8) {
  const NormLaunch l = norm_launch(n_rows, n, q8, {x, weight, y});
  if (n_rows == 0) return;
  const Q8Activations none{};
  const Q8Activations& out = q8 != nullptr ? *q8 : none;
  if (l.vec4) {
    if (q8 != nullptr) rms_norm_kernel<4, true><<<l.rows, l.threads, 0, stream>>>(x, weight, y, n, eps, out);
    else rms_norm_kernel<4, false><<<l.rows, l.threads, 0, stream>>>(x, weight, y, n, eps, out);
  } else {
    if (q8 != nullptr) rms_norm_kernel<1, true><<<l.rows, l.threads, 0, stream>>>(x, weight, y, n, eps, out);
    else rms_norm_kernel<1, false><<<l.rows, l.threads, 0, stream>>>(x, weight, y, n, eps, out);
  }
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void add_rms_norm(float* x, const float* y, const float* weight, float* out, int64_t n_rows, int64_t n, float eps,
                  cudaStream_t stream, const Q8Activations* q8) {
  const NormLaunch l = norm_launch(n_rows, n, q8, {x, y, weight, out});
  if (n_rows == 0) return;
  const Q8Activations none{};
  const Q8Activations& o = q8 != nullptr ? *q8 : none;
  if (l.vec4) {
    if (q8 != nullptr) add_rms_norm_kernel<4, true><<<l.rows, l.threads, 0, stream>>>(x, y, weight, out, n, eps, o);
    else add_rms_norm_kernel<4, false><<<l.rows, l.threads, 0, stream>>>(x, y, weight, out, n, eps, o);
  } else {
    if (q8 != nullptr) add_rms_norm_kernel<1, true><<<l.rows, l.threads, 0, stream>>>(x, y, weight, out, n, eps, o);
    else add_rms_norm_kernel<1, false><<<l.rows, l.threads, 0, stream>>>(x, y, weight, out, n, eps, o);
  }
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream, const Q8Activations* q8) {
  require(n >= 0, "silu_mul: bad shape");
  require(q8 == nullptr || n % detail::kQ8Block == 0, "silu_mul: a quantized output needs a multiple of 32 elements");
  if (n == 0) return;
  if (q8 != nullptr) {
    silu_mul_kernel<true><<<grid_for(n, kThreads), kThreads, 0, stream>>>(gate, up, out, n, *q8);
  } else {
    silu_mul_kernel<false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(gate, up, out, n, {});
  }
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

void rope_qk_to_f16(float* q, float* k, const float* v, const int32_t* positions, const float* inv_freq,
                    int64_t n_tokens, int n_q_heads, int n_kv_heads, int head_dim, int n_rot, float mscale,
                    RopeStyle style, uint16_t* k16, uint16_t* v16, cudaStream_t stream) {
  require(n_tokens >= 0 && n_q_heads > 0 && n_kv_heads > 0 && head_dim > 0, "rope: bad shape");
  require(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= head_dim, "rope: n_rot must be even and at most head_dim");
  const int64_t total = n_tokens * ((n_q_heads + n_kv_heads) * (head_dim - n_rot / 2) + int64_t(n_kv_heads) * head_dim);
  if (total == 0) return;
  rope_qk_to_f16_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(
      q, k, v, positions, inv_freq, n_tokens, n_q_heads, n_kv_heads, head_dim, n_rot, mscale,
      style == RopeStyle::kInterleaved, k16, v16);
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
