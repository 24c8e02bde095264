#include "kernels/cuda/prefill_attention.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.h"
#include "kernels/cuda/gemm.h"

namespace lazykv::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kGatherSlots = 32;                       // slots a gather block transposes at once
constexpr int64_t kMaxQueryBlock = 1024;               // tokens per score block
constexpr int64_t kScoreElements = int64_t(32) << 20;  // scores of one block, all queries of the group

// Slots [32·blockIdx.x, +32) of a head's pages into row-major [n][head_dim]
// K and V: keys are [head_dim][page_slots] in a page, so they pass through
// shared memory to turn around; values are rows already.
__global__ void gather_kv_kernel(const uint16_t* const* __restrict__ keys, const uint16_t* const* __restrict__ values,
                                 int32_t page_slots, int32_t n, int head_dim, uint16_t* __restrict__ k_rows,
                                 uint16_t* __restrict__ v_rows) {
  extern __shared__ uint16_t tile[];  // [kGatherSlots][head_dim + 1]
  const int32_t s0 = int32_t(blockIdx.x) * kGatherSlots;
  const int pitch = head_dim + 1;
  // Thread (d0, j): slot s0 + j (neighbouring threads, neighbouring slots of
  // a key row), dimensions d0, d0 + 8, ...: its page found once, the loads
  // independent so they go out together.
  const int j = int(threadIdx.x) % kGatherSlots;
  const int32_t s = s0 + j;
  if (s < n) {
    const uint16_t* key = keys[s / page_slots] + s % page_slots;
#pragma unroll 8
    for (int d = int(threadIdx.x) / kGatherSlots; d < head_dim; d += kThreads / kGatherSlots) {
      tile[j * pitch + d] = key[int64_t(d) * page_slots];
    }
  }
  __syncthreads();
#pragma unroll 8
  for (int e = threadIdx.x; e < kGatherSlots * head_dim; e += kThreads) {
    const int row = e / head_dim, d = e % head_dim;
    const int32_t slot = s0 + row;
    if (slot >= n) continue;
    k_rows[int64_t(slot) * head_dim + d] = tile[row * pitch + d];
    v_rows[int64_t(slot) * head_dim + d] = values[slot / page_slots][int64_t(slot % page_slots) * head_dim + d];
  }
}

// The group's queries as f16 [n_tokens][width], width = n_group·head_dim.
__global__ void queries_to_f16_kernel(const float* __restrict__ q, int64_t q_stride, int64_t n_tokens, int width,
                                      __half* __restrict__ out) {
  const int64_t total = n_tokens * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = saturate_to_f16(q[(i / width) * q_stride + i % width]);
  }
}

// Row (g, t) of the block's scores [n_group][block][n] to probabilities in
// f16: token t0 + t sees the first `visible` slots, 0 past them.
__global__ void masked_softmax_kernel(const float* __restrict__ scores, int64_t block, int64_t n, int32_t n_slots,
                                      int64_t n_tokens, int64_t t0, __half* __restrict__ probs) {
  __shared__ float reduce[32];
  const int64_t row = blockIdx.x;
  const int64_t t = t0 + row % block;
  const int64_t seen = n_slots - (n_tokens - 1 - t);
  const int64_t visible = seen < n ? seen : n;
  const float* s = scores + row * n;
  __half* p = probs + row * n;
  float max = -INFINITY;
  for (int64_t i = threadIdx.x; i < visible; i += blockDim.x) max = fmaxf(max, s[i]);
  max = block_max(max, reduce);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < visible; i += blockDim.x) sum += expf(s[i] - max);
  const float inv = 1.0f / block_sum(sum, reduce);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    p[i] = __float2half_rn(i < visible ? expf(s[i] - max) * inv : 0.0f);
  }
}

}  // namespace

PrefillAttention::PrefillAttention(cudaStream_t stream) : stream_(stream) {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  try {
    check_cublas(cublasSetStream(handle_, stream_), "cublasSetStream");
  } catch (...) {
    static_cast<void>(cublasDestroy(handle_));
    throw;
  }
}

PrefillAttention::~PrefillAttention() { static_cast<void>(cublasDestroy(handle_)); }

void PrefillAttention::reserve(int64_t max_tokens, int32_t max_slots, int n_group, int head_dim) {
  reserve_device(keys_, size_t(max_slots) * size_t(head_dim));
  reserve_device(values_, size_t(max_slots) * size_t(head_dim));
  reserve_device(queries_, size_t(max_tokens) * size_t(n_group) * size_t(head_dim));
  const int64_t block = std::min(max_tokens, kMaxQueryBlock);
  const int64_t scores =
      std::min(int64_t(n_group) * block * max_slots, std::max(kScoreElements, int64_t(n_group) * max_slots));
  reserve_device(scores_, size_t(scores));
  reserve_device(probs_, size_t(scores));
}

void PrefillAttention::run(const float* q, int64_t q_stride, const uint16_t* const* keys, const uint16_t* const* values,
                           int32_t page_slots, int32_t n_slots, int64_t n_tokens, int n_group, int head_dim,
                           float scale, float* out, int64_t out_stride) {
  require(n_tokens > 0 && n_group > 0 && head_dim > 0 && page_slots > 0 && n_slots >= n_tokens,
          "PrefillAttention: bad shape");
  const int64_t width = int64_t(n_group) * head_dim;
  require(size_t(n_slots) * size_t(head_dim) <= keys_.size() && size_t(n_tokens * width) <= queries_.size() &&
              size_t(n_group) * size_t(n_slots) <= scores_.size(),
          "PrefillAttention: reserve() was not called for a chunk this large");
  auto* k_rows = reinterpret_cast<__half*>(keys_.data());
  auto* v_rows = reinterpret_cast<__half*>(values_.data());
  auto* queries = reinterpret_cast<__half*>(queries_.data());
  auto* probs = reinterpret_cast<__half*>(probs_.data());
  const unsigned gather_blocks = static_cast<unsigned>((n_slots + kGatherSlots - 1) / kGatherSlots);
  const size_t tile_bytes = size_t(kGatherSlots) * size_t(head_dim + 1) * sizeof(uint16_t);
  gather_kv_kernel<<<gather_blocks, kThreads, tile_bytes, stream_>>>(keys, values, page_slots, n_slots, head_dim,
                                                                     keys_.data(), values_.data());
  LAZYKV_CUDA_CHECK_LAUNCH();
  queries_to_f16_kernel<<<grid_for(n_tokens * width, kThreads), kThreads, 0, stream_>>>(q, q_stride, n_tokens,
                                                                                        int(width), queries);
  LAZYKV_CUDA_CHECK_LAUNCH();
  // Blocks of tokens whose scores fit; each over the slots its last token sees.
  const int64_t block = std::max<int64_t>(
      1, std::min({kMaxQueryBlock, n_tokens, int64_t(scores_.size()) / (int64_t(n_group) * n_slots)}));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += block) {
    const int64_t rows = std::min(block, n_tokens - t0);
    const int64_t n = n_slots - (n_tokens - (t0 + rows));
    // Column-major terms, per query head g: Sᵀ[n, rows] = K[n, d] · Q_gᵀ[d, rows]
    // (K row-major [n][d] is col-major [d][n]; Q_g rows are `width` apart).
    check_cublas(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(rows), head_dim, &scale,
                                            k_rows, CUDA_R_16F, head_dim, 0, queries + t0 * width, CUDA_R_16F,
                                            int(width), head_dim, &zero, scores_.data(), CUDA_R_32F, int(n), rows * n,
                                            n_group, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx (scores)");
    masked_softmax_kernel<<<static_cast<unsigned>(n_group * rows), kThreads, 0, stream_>>>(
        scores_.data(), rows, n, n_slots, n_tokens, t0, probs);
    LAZYKV_CUDA_CHECK_LAUNCH();
    // Oᵀ_g[d, rows] = V[d, n] (row-major [n][d] is col-major [d][n]) · P_gᵀ[n, rows].
    check_cublas(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, head_dim, int(rows), int(n), &one,
                                            v_rows, CUDA_R_16F, head_dim, 0, probs, CUDA_R_16F, int(n), rows * n, &zero,
                                            out + t0 * out_stride, CUDA_R_32F, int(out_stride), head_dim, n_group,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx (values)");
  }
}

}  // namespace lazykv::cuda
