// Writing a device KV pool: staged pages into their places, or new K/V rows
// into their slots, one launch however many pages or rows a step writes (a
// copy call each would cost more than the bytes).
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {
namespace {

using detail::require;

constexpr int kThreads = 256;

// One block per page, 16-byte words.
__global__ void scatter_pages_kernel(const uint4* __restrict__ staged, uint8_t* const* __restrict__ dst,
                                     int64_t page_words) {
  const uint4* src = staged + blockIdx.x * page_words;
  uint4* out = reinterpret_cast<uint4*>(dst[blockIdx.x]);
  for (int64_t i = threadIdx.x; i < page_words; i += blockDim.x) out[i] = src[i];
}

// One block per new row; keys go to column in_page of the transposed key page.
__global__ void scatter_kv_rows_kernel(const uint16_t* __restrict__ k16, const uint16_t* __restrict__ v16,
                                       const KvRowTarget* __restrict__ targets, int head_dim, int32_t page_slots) {
  const KvRowTarget t = targets[blockIdx.x];
  const uint16_t* k = k16 + int64_t(t.row) * head_dim;
  const uint16_t* v = v16 + int64_t(t.row) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    t.keys[int64_t(d) * page_slots + t.in_page] = k[d];
    t.values[int64_t(t.in_page) * head_dim + d] = v[d];
  }
}

}  // namespace

void scatter_kv_rows(const uint16_t* k16, const uint16_t* v16, const KvRowTarget* targets, int64_t n_targets,
                     int head_dim, int32_t page_slots, cudaStream_t stream) {
  require(n_targets >= 0 && head_dim > 0 && page_slots > 0, "scatter_kv_rows: bad shape");
  require(n_targets <= 0x7fffffff, "scatter_kv_rows: too many rows for one launch");
  if (n_targets == 0) return;
  scatter_kv_rows_kernel<<<static_cast<unsigned>(n_targets), 128, 0, stream>>>(k16, v16, targets, head_dim,
                                                                               page_slots);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void scatter_pages(const uint8_t* staged, uint8_t* const* dst, int64_t n_pages, int64_t page_bytes,
                   cudaStream_t stream) {
  require(n_pages >= 0 && page_bytes > 0 && page_bytes % 16 == 0, "scatter_pages: bad shape");
  require(reinterpret_cast<uintptr_t>(staged) % 16 == 0, "scatter_pages: staged pages not 16-byte aligned");
  require(n_pages <= 0x7fffffff, "scatter_pages: too many pages for one launch");
  if (n_pages == 0) return;
  scatter_pages_kernel<<<static_cast<unsigned>(n_pages), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(staged), dst, page_bytes / 16);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

}  // namespace lazykv::cuda
