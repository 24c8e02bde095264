// Attention over paged f16 KV, mirroring cpu::attention_group.
// attention_group: one query group in three launches: scores (one warp per
// slot, the group's queries in shared memory so each key row is read once), a
// row softmax that leaves the probabilities in place, and the weighted sum of V.
// attention_units: many groups (a pass's every token and cache head) in two
// launches, each group's slots split across blocks, then merged.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {
namespace {

using namespace detail;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMaxSplitSlots = kThreads;  // slots per attention_units block: at most one thread each
constexpr int kMinSplitSlots = kWarpSize;
// Split blocks a launch aims for: fewer units (one short decode) get smaller
// splits, so a few KV heads still spread over the GPU instead of 8 blocks.
constexpr int64_t kTargetSplitBlocks = 512;
constexpr int kScoreGroup = 8;         // queries per pass over a split's keys
constexpr int kValueGroup = 4;         // queries per pass over its values
constexpr int kMaxDimsPerLane = 4;     // head_dim up to 128; a lane's neighbouring value dimensions
constexpr int kKeyBatch = 16;          // key element pairs a thread loads at once

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

// Split attention (flash-decoding): block (unit, split) takes the unit's
// slots [split·split_slots, +split_slots), leaves their raw scaled scores in
// probs and, per query, its partial softmax state in scratch: the split's
// max m, Σ exp(score - m) and Σ exp(score - m)·v (head_dim floats). A long
// context is many blocks instead of one; attention_combine_kernel merges the
// splits. Each key element is loaded once for up to kScoreGroup queries and
// each value element once for kValueGroup, so the group shares the reads.
// Dynamic shared memory: q [max_group, head_dim], scores [max_group,
// kMaxSplitSlots], weights [kValueGroup, kMaxSplitSlots], then one area that
// holds first the score parts [kScoreGroup, 2 * kThreads] and later the
// warps' partial value sums [kWarps, kValueGroup, head_dim].
__global__ void attention_split_kernel(const AttentionUnit* __restrict__ units, int max_group, int head_dim,
                                       int32_t page_slots, float scale, int split_slots,
                                       float* __restrict__ scratch) {
  extern __shared__ float shared[];
  __shared__ float reduce[32];
  const AttentionUnit u = units[blockIdx.x];
  const int32_t first = int32_t(blockIdx.y) * split_slots;
  if (first >= u.n_slots) return;  // past this unit's slots: combine reads only its own splits
  const int32_t last = min(u.n_slots, first + split_slots);
  float* q = shared;
  float* scores = q + max_group * head_dim;
  float* weight = scores + max_group * kMaxSplitSlots;
  float* partial = weight + kValueGroup * kMaxSplitSlots;
  const int n_group = u.n_group;
  const int32_t n = u.n_slots;
  const int per_token = n_group / u.n_tokens;
  for (int i = threadIdx.x; i < n_group * head_dim; i += blockDim.x) {
    const int g = i / head_dim;
    q[i] = u.q[int64_t(g / per_token) * u.token_stride + (g % per_token) * head_dim + i % head_dim];
  }
  __syncthreads();
  // Scores: thread (part, pair) takes dimensions part, part + parts, ... of
  // two neighbouring slots, one 4-byte load each, so a warp reads up to 64
  // neighbouring slots of each key row of a page (keys are [head_dim]
  // [page_slots] within a page; page_slots is even, so a pair shares a page);
  // the parts meet in shared memory.
  const int pairs = split_slots / 2;
  const int parts = kThreads / pairs;
  const int part = int(threadIdx.x) / pairs;
  const int32_t s = first + 2 * (int32_t(threadIdx.x) % pairs);
  const uint16_t* kp = s < last ? u.keys[s / page_slots] + s % page_slots : nullptr;
  for (int g0 = 0; g0 < n_group; g0 += kScoreGroup) {
    float dot[kScoreGroup][2] = {};
    // kKeyBatch pairs loaded before any is used: one memory round trip per
    // batch, not per element.
    for (int d0 = part; kp != nullptr && d0 < head_dim; d0 += kKeyBatch * parts) {
      float2 key[kKeyBatch];
#pragma unroll
      for (int b = 0; b < kKeyBatch; ++b) {
        const int d = d0 + b * parts;
        key[b] = d < head_dim ? __half22float2(*reinterpret_cast<const __half2*>(kp + int64_t(d) * page_slots))
                              : make_float2(0.0f, 0.0f);
      }
#pragma unroll
      for (int b = 0; b < kKeyBatch; ++b) {
        const int d = d0 + b * parts;
        if (d >= head_dim) break;
#pragma unroll
        for (int i = 0; i < kScoreGroup; ++i) {
          if (g0 + i >= n_group) break;
          const float qd = q[(g0 + i) * head_dim + d];
          dot[i][0] = fmaf(qd, key[b].x, dot[i][0]);
          dot[i][1] = fmaf(qd, key[b].y, dot[i][1]);
        }
      }
    }
    // partial[i][part][slot - first]: parts * split_slots = 2 * kThreads per query.
    const int local0 = 2 * (int(threadIdx.x) % pairs);
#pragma unroll
    for (int i = 0; i < kScoreGroup; ++i) {
      partial[i * 2 * kThreads + part * split_slots + local0] = dot[i][0];
      partial[i * 2 * kThreads + part * split_slots + local0 + 1] = dot[i][1];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kScoreGroup * split_slots; e += blockDim.x) {
      const int i = e / split_slots, local = e % split_slots;
      if (g0 + i >= n_group || first + local >= last) continue;
      float total = 0.0f;
      for (int p = 0; p < parts; ++p) total += partial[i * 2 * kThreads + p * split_slots + local];
      // Past its token's slots (a unit of several tokens): masked.
      const int32_t visible = n - (u.n_tokens - 1 - (g0 + i) / per_token);
      const float score = first + local < visible ? scale * total : -INFINITY;
      if (u.probs != nullptr) u.probs[int64_t(g0 + i) * n + first + local] = score;
      scores[(g0 + i) * kMaxSplitSlots + local] = score;
    }
    __syncthreads();  // partial is rewritten by the next queries; scores are read below
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // Thread t holds slot first + t's weights.
  const bool own_slot = int(threadIdx.x) < split_slots && first + int32_t(threadIdx.x) < last;
  float* state = scratch + (int64_t(blockIdx.x) * gridDim.y + blockIdx.y) * max_group * (head_dim + 2);
  for (int g0 = 0; g0 < n_group; g0 += kValueGroup) {
    const int n_value = min(kValueGroup, n_group - g0);
    for (int i = 0; i < n_value; ++i) {
      const float score = own_slot ? scores[(g0 + i) * kMaxSplitSlots + threadIdx.x] : -INFINITY;
      const float m = block_max(score, reduce);  // -inf: every slot of the split masked for this query
      const float e = own_slot && score != -INFINITY ? expf(score - m) : 0.0f;
      weight[i * kMaxSplitSlots + threadIdx.x] = e;
      const float l = block_sum(e, reduce);  // its barriers publish weight[]
      if (threadIdx.x == 0) {
        state[(g0 + i) * (head_dim + 2)] = m;
        state[(g0 + i) * (head_dim + 2) + 1] = l;
      }
    }
    // Σ e_s v_s: warp w sums slots w, w + kWarps, ... for every query of the
    // group at once; lane takes kMaxDimsPerLane neighbouring dimensions, one
    // 8-byte load (head_dim is a multiple of 4).
    float acc[kValueGroup][kMaxDimsPerLane] = {};
    const int d0 = lane * kMaxDimsPerLane;
    if (d0 < head_dim) {
#pragma unroll 4
      for (int32_t t = first + warp; t < last; t += kWarps) {
        const uint2 raw = *reinterpret_cast<const uint2*>(slot_row(u.values, page_slots, t, head_dim) + d0);
        const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
        const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
        const float value[kMaxDimsPerLane] = {lo.x, lo.y, hi.x, hi.y};
#pragma unroll
        for (int i = 0; i < kValueGroup; ++i) {
          const float w = weight[i * kMaxSplitSlots + (t - first)];
#pragma unroll
          for (int j = 0; j < kMaxDimsPerLane; ++j) acc[i][j] = fmaf(w, value[j], acc[i][j]);
        }
      }
#pragma unroll
      for (int i = 0; i < kValueGroup; ++i) {
#pragma unroll
        for (int j = 0; j < kMaxDimsPerLane; ++j) partial[(warp * kValueGroup + i) * head_dim + d0 + j] = acc[i][j];
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_value * head_dim; e += blockDim.x) {
      const int i = e / head_dim, d = e % head_dim;
      float total = 0.0f;
      for (int w = 0; w < kWarps; ++w) total += partial[(w * kValueGroup + i) * head_dim + d];
      state[(g0 + i) * (head_dim + 2) + 2 + d] = total;
    }
    __syncthreads();  // weight and partial are reused by the next queries
  }
}

// Block (unit, query): the splits' states merged (the global max M, the sum
// S = Σ l_j·exp(m_j - M)), out = Σ o_j·exp(m_j - M) / S, and the raw scores
// in probs turned into probabilities exp(score - M) / S. Thread (part, d)
// sums dimension d over splits part, part + parts, ..., so a long context's
// many splits are read by the whole block at once.
__global__ void attention_combine_kernel(const AttentionUnit* __restrict__ units, int max_group, int head_dim,
                                         int split_slots, int n_splits, const float* __restrict__ scratch) {
  __shared__ float reduce[32];
  __shared__ float part_sums[kThreads];
  const AttentionUnit u = units[blockIdx.x];
  const int g = int(blockIdx.y);
  if (g >= u.n_group) return;
  const int splits = (u.n_slots + split_slots - 1) / split_slots;
  const int64_t stride = int64_t(max_group) * (head_dim + 2);  // from a split's state to the next's
  const float* first = scratch + int64_t(blockIdx.x) * n_splits * stride + int64_t(g) * (head_dim + 2);
  float max = -INFINITY;
  for (int j = threadIdx.x; j < splits; j += blockDim.x) max = fmaxf(max, first[j * stride]);
  max = block_max(max, reduce);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < splits; j += blockDim.x) sum += first[j * stride + 1] * expf(first[j * stride] - max);
  sum = block_sum(sum, reduce);
  const float inv = splits > 0 ? 1.0f / sum : 0.0f;  // no slots: out = 0, as the CPU
  const int parts = int(blockDim.x) / head_dim;
  const int part = int(threadIdx.x) / head_dim, d = int(threadIdx.x) % head_dim;
  float total = 0.0f;
  if (part < parts) {
#pragma unroll 8
    for (int j = part; j < splits; j += parts) total += first[j * stride + 2 + d] * expf(first[j * stride] - max);
  }
  part_sums[threadIdx.x] = total;
  __syncthreads();
  if (part == 0) {
    for (int p = 1; p < parts; ++p) total += part_sums[p * head_dim + d];
    const int per_token = u.n_group / u.n_tokens;
    u.out[int64_t(g / per_token) * u.token_stride + (g % per_token) * head_dim + d] = total * inv;
  }
  if (u.probs == nullptr) return;  // nobody reads them
  float* row = u.probs + int64_t(g) * u.n_slots;
  for (int32_t s = threadIdx.x; s < u.n_slots; s += blockDim.x) row[s] = expf(row[s] - max) * inv;
}

int64_t splits_of(int32_t max_slots, int split_slots) {
  return std::max<int64_t>(1, (int64_t(max_slots) + split_slots - 1) / split_slots);
}

// The slots of a split: the largest power of two from kMaxSplitSlots down to
// kMinSplitSlots at which the launch still reaches kTargetSplitBlocks blocks,
// halved only while the halving keeps it within that number.
int split_slots_for(int64_t n_units, int32_t max_slots) {
  int split = kMaxSplitSlots;
  while (split > kMinSplitSlots && n_units * splits_of(max_slots, split / 2) <= kTargetSplitBlocks) split /= 2;
  return split;
}

}  // namespace

size_t attention_scratch_floats(int64_t n_units, int max_group, int head_dim, int32_t max_slots) {
  // A bound that grows with n_units (a wave of fewer units never needs more
  // than the whole pass): split_slots_for never goes past kTargetSplitBlocks
  // blocks by halving, nor below the blocks of the largest split.
  const int64_t smallest = n_units * splits_of(max_slots, kMinSplitSlots);
  const int64_t blocks = std::max(std::min(kTargetSplitBlocks, smallest), n_units * splits_of(max_slots, kMaxSplitSlots));
  return size_t(blocks) * size_t(max_group) * size_t(head_dim + 2);
}

void attention_units(const AttentionUnit* units, int64_t n_units, int max_group, int head_dim, int32_t page_slots,
                     float scale, int32_t max_slots, float* scratch, cudaStream_t stream) {
  require(n_units >= 0 && max_group > 0 && head_dim > 0 && page_slots > 0 && max_slots >= 0,
          "cuda::attention_units: bad shape");
  require(n_units <= 0x7fffffff, "cuda::attention_units: too many units for one launch");
  require(head_dim <= kMaxDimsPerLane * kWarpSize && head_dim % kMaxDimsPerLane == 0,
          "cuda::attention_units: head_dim must be a multiple of 4, at most 128");
  require(page_slots % 2 == 0, "cuda::attention_units: page_slots must be even");
  const size_t shared_floats = size_t(max_group) * (size_t(head_dim) + kMaxSplitSlots) +
                               size_t(kValueGroup) * kMaxSplitSlots +
                               std::max(size_t(kWarps) * kValueGroup * size_t(head_dim),
                                        size_t(kScoreGroup) * 2 * kThreads);
  const size_t shared_bytes = shared_floats * sizeof(float);
  // 48 KiB in all without opting in, the kernel's static reduce[32] included.
  require(shared_bytes + 32 * sizeof(float) <= 48 * 1024, "cuda::attention_units: group too large");
  if (n_units == 0) return;
  const int split_slots = split_slots_for(n_units, max_slots);
  const int64_t splits = splits_of(max_slots, split_slots);
  require(splits < 65536, "cuda::attention_units: too many slots for one launch");
  const dim3 grid(static_cast<unsigned>(n_units), static_cast<unsigned>(splits));
  attention_split_kernel<<<grid, kThreads, shared_bytes, stream>>>(units, max_group, head_dim, page_slots, scale,
                                                                   split_slots, scratch);
  LAZYKV_CUDA_CHECK_LAUNCH();
  const dim3 combine_grid(static_cast<unsigned>(n_units), static_cast<unsigned>(max_group));
  attention_combine_kernel<<<combine_grid, kThreads, 0, stream>>>(units, max_group, head_dim, split_slots,
                                                                  static_cast<int>(splits), scratch);
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
