// Placing staged KV pages into a device pool: one launch however many pages
// a step wrote (a copy call per page would cost more than the bytes).
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

}  // namespace

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
