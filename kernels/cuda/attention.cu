// Attention over paged f16 KV, mirroring cpu::attention_group.
// attention_group: one query group in three launches: scores (one warp per
// slot, the group's queries in shared memory so each key row is read once), a
// row softmax that leaves the probabilities in place, and the weighted sum of V.
// attention_units: many groups (a pass's every token and cache head) in one
// launch, a block per group.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {
namespace {

using namespace detail;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;

__device__ __forceinline__ const uint16_t* slot_row(const uint16_t* const* pages, int32_t page_slots, int32_t slot,
                                                    int head_dim) {
  return pages[slot / page_slots] + int64_t(slot % page_slots) * head_dim;
}

// Dynamic shared memory: q [n_group, head_dim].
__global__ void scores_kernel(const float* __restrict__ q, int n_group, int head_dim, KvPages kv, int64_t max_pos,
                              float scale, float* __restrict__ scores) {
  extern __shared__ float q_shared[];
  for (int i = threadIdx.x; i < n_group * head_dim; i += blockDim.x) q_shared[i] = q[i];
  __syncthreads();
  const int lane = threadIdx.x % kWarpSize;
  const int32_t slot = blockIdx.x * kWarps + threadIdx.x / kWarpSize;
  if (slot >= kv.n_slots) return;
  const int64_t n = kv.n_slots;
  if (kv.positions[slot] > max_pos) {  // causal mask
    if (lane < n_group) scores[lane * n + slot] = -INFINITY;
    for (int g = kWarpSize + lane; g < n_group; g += kWarpSize) scores[g * n + slot] = -INFINITY;
    return;
  }
  // Keys are [head_dim][page_slots] within a page (see cpu::KvPages).
  const uint16_t* kp = kv.keys[slot / kv.page_slots] + slot % kv.page_slots;
  for (int g = 0; g < n_group; ++g) {
    const float* qg = q_shared + g * head_dim;
    float dot = 0.0f;
    for (int d = lane; d < head_dim; d += kWarpSize) {
      dot = fmaf(qg[d], f16_bits_to_float(kp[int64_t(d) * kv.page_slots]), dot);
    }
    dot = warp_sum(dot);
    if (lane == 0) scores[g * n + slot] = scale * dot;
  }
}

// In-place softmax of row[n] by the whole block; returns the log-sum-exp to
// every thread. An empty or fully masked row becomes zeros, lse -inf.
__device__ float block_softmax(float* row, int64_t n, float* scratch) {
  float max = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) max = fmaxf(max, row[i]);
  max = block_max(max, scratch);
  if (max == -INFINITY) {  // everything masked: no attention at all
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row[i] = 0.0f;
    return -INFINITY;
  }
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = expf(row[i] - max);
    row[i] = e;
    sum += e;
  }
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row[i] *= inv;
  return max + logf(sum);
}

// One block per query row: in-place softmax, log-sum-exp to lse[g].
__global__ void softmax_kernel(float* scores, int64_t n, float* lse) {
  __shared__ float scratch[32];
  const float l = block_softmax(scores + blockIdx.x * n, n, scratch);
  if (lse != nullptr && threadIdx.x == 0) lse[blockIdx.x] = l;
}

// One block per query row; warp w sums slots w, w + kWarps, ... into its own
// row of shared partials [kWarps, head_dim], reduced at the end.
__global__ void weighted_values_kernel(const float* __restrict__ probs, int head_dim, KvPages kv,
                                       float* __restrict__ out) {
  extern __shared__ float partial[];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float* mine = partial + warp * head_dim;
  for (int d = lane; d < head_dim; d += kWarpSize) mine[d] = 0.0f;
  const float* p = probs + int64_t(blockIdx.x) * kv.n_slots;
  for (int32_t s = warp; s < kv.n_slots; s += kWarps) {
    const float w = p[s];
    if (w == 0.0f) continue;  // masked (or underflowed) slots cost no V read
    const uint16_t* v = slot_row(kv.values, kv.page_slots, s, head_dim);
    for (int d = lane; d < head_dim; d += kWarpSize) mine[d] = fmaf(w, f16_bits_to_float(v[d]), mine[d]);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int i = 0; i < kWarps; ++i) sum += partial[i * head_dim + d];
    out[int64_t(blockIdx.x) * head_dim + d] = sum;
  }
}

// One block per unit. Dynamic shared memory: q [max_group, head_dim], then
// the warps' partial value sums [kWarps, head_dim].
__global__ void attention_units_kernel(const AttentionUnit* __restrict__ units, int max_group, int head_dim,
                                       int32_t page_slots, float scale) {
  extern __shared__ float shared[];
  __shared__ float scratch[32];
  const AttentionUnit u = units[blockIdx.x];
  float* q = shared;
  float* partial = shared + max_group * head_dim;
  const int n_group = u.n_group;
  const int32_t n = u.n_slots;
  for (int i = threadIdx.x; i < n_group * head_dim; i += blockDim.x) q[i] = u.q[i];
  __syncthreads();
  // Scores: a thread per slot, so a warp reads 32 neighbouring slots of each
  // key row of a page (keys are [head_dim][page_slots] within a page).
  for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
    const uint16_t* kp = u.keys[s / page_slots] + s % page_slots;
    for (int g = 0; g < n_group; ++g) {
      const float* qg = q + g * head_dim;
      float dot = 0.0f;
      for (int d = 0; d < head_dim; ++d) dot = fmaf(qg[d], f16_bits_to_float(kp[int64_t(d) * page_slots]), dot);
      u.probs[int64_t(g) * n + s] = scale * dot;
    }
  }
  __syncthreads();  // the block's global writes are visible to the block after this
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int g = 0; g < n_group; ++g) {
    float* row = u.probs + int64_t(g) * n;
    block_softmax(row, n, scratch);
    __syncthreads();
    // out[g] = Σ p_s v_s: warp w sums slots w, w + kWarps, ... into its partial row.
    float* mine = partial + warp * head_dim;
    for (int d = lane; d < head_dim; d += kWarpSize) mine[d] = 0.0f;
    for (int32_t s = warp; s < n; s += kWarps) {
      const float w = row[s];
      if (w == 0.0f) continue;
      const uint16_t* v = slot_row(u.values, page_slots, s, head_dim);
      for (int d = lane; d < head_dim; d += kWarpSize) mine[d] = fmaf(w, f16_bits_to_float(v[d]), mine[d]);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
      float total = 0.0f;
      for (int i = 0; i < kWarps; ++i) total += partial[i * head_dim + d];
      u.out[int64_t(g) * head_dim + d] = total;
    }
    __syncthreads();  // partial is reused by the next query
  }
}

}  // namespace

void attention_units(const AttentionUnit* units, int64_t n_units, int max_group, int head_dim, int32_t page_slots,
                     float scale, cudaStream_t stream) {
  require(n_units >= 0 && max_group > 0 && head_dim > 0 && page_slots > 0, "cuda::attention_units: bad shape");
  require(n_units <= 0x7fffffff, "cuda::attention_units: too many units for one launch");
  const size_t shared_bytes = (size_t(max_group) + kWarps) * size_t(head_dim) * sizeof(float);
  // 48 KiB in all without opting in, the kernel's static scratch[32] included.
  require(shared_bytes + 32 * sizeof(float) <= 48 * 1024, "cuda::attention_units: group too large");
  if (n_units == 0) return;
  attention_units_kernel<<<static_cast<unsigned>(n_units), kThreads, shared_bytes, stream>>>(units, max_group,
                                                                                             head_dim, page_slots, scale);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void attention_group(const float* q, int n_group, int head_dim, const KvPages& kv, int64_t max_pos, float scale,
                     float* probs, float* out, float* lse, cudaStream_t stream) {
  require(n_group > 0 && head_dim > 0 && kv.n_slots >= 0 && kv.page_slots > 0, "cuda::attention_group: bad shape");
  const size_t q_bytes = size_t(n_group) * head_dim * sizeof(float);
  const size_t partial_bytes = size_t(kWarps) * head_dim * sizeof(float);
  // 48 KiB: the dynamic shared memory every launch gets without opting in.
  require(q_bytes <= 48 * 1024 && partial_bytes <= 48 * 1024, "cuda::attention_group: group too large");
  if (kv.n_slots > 0) {
    const unsigned slot_blocks = static_cast<unsigned>((kv.n_slots + kWarps - 1) / kWarps);
    scores_kernel<<<slot_blocks, kThreads, q_bytes, stream>>>(q, n_group, head_dim, kv, max_pos, scale, probs);
    LAZYKV_CUDA_CHECK_LAUNCH();
  }
  // Also with no slots: an empty row's log-sum-exp is -inf, as on the CPU.
  softmax_kernel<<<static_cast<unsigned>(n_group), 1024, 0, stream>>>(probs, kv.n_slots, lse);
  LAZYKV_CUDA_CHECK_LAUNCH();
  weighted_values_kernel<<<static_cast<unsigned>(n_group), kThreads, partial_bytes, stream>>>(probs, head_dim, kv,
                                                                                            out);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

}  // namespace lazykv::cuda
