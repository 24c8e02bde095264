#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tiled_format.h"

namespace lazykv::cuda {
namespace {

using namespace detail;

constexpr int64_t kBlockElements = int64_t(32) << 20;  // weights dequantized per GEMM (64 MB of f16)

constexpr int kUntileWarps = 8;

// Rows [row0, row0 + n_rows) of the tiled matrix as row-major f16. A warp
// per (tile, chunk): its lanes read the tile's 512 contiguous bytes (a row
// each), decode into shared memory and write the rows back out row by row,
// so both the reads and the writes are contiguous.
template <DType kType>
__global__ void __launch_bounds__(kUntileWarps* kWarpSize)
    untile_kernel(const uint8_t* __restrict__ tiles, TiledShape s, int64_t row0, int64_t n_rows,
                  __half* __restrict__ dst) {
  using Format = TiledFormat<kType>;
  constexpr int kElems = Format::kElems;
  constexpr int kChunksPerBlock = kElems >= cpu::kQK ? 1 : cpu::kQK / kElems;
  __shared__ float staged[kUntileWarps][kTileRows][kElems + 1];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t items = (n_rows + kTileRows - 1) / kTileRows * s.n_chunks;
  const uint8_t* scales = tiles + s.row_tiles * s.n_chunks * kTileChunkBytes;
  for (int64_t item = int64_t(blockIdx.x) * kUntileWarps + warp; item < items;
       item += int64_t(gridDim.x) * kUntileWarps) {
    const int64_t c = item % s.n_chunks, first = item / s.n_chunks * kTileRows;  // first: of the block's rows
    const int64_t row = row0 + first + lane, tile = row / kTileRows;           // row0 is whole tiles
    const uint4 q = *reinterpret_cast<const uint4*>(tiles + (tile * s.n_chunks + c) * kTileChunkBytes +
                                                    lane * kChunkBytes);
    const uint32_t scale = load_scale<kType>(
        scales + ((tile * s.n_blocks + c / kChunksPerBlock) * kTileRows + lane) * Format::kScaleBytes);
    float w[kElems];
    decode_chunk<kType>(q, scale, w);
#pragma unroll
    for (int e = 0; e < kElems; ++e) staged[warp][lane][e] = w[e];
    __syncwarp();
    for (int e = lane; e < kTileRows * kElems; e += kWarpSize) {
      const int64_t r = first + e / kElems, col = c * kElems + e % kElems;
      if (r < n_rows && col < s.cols) dst[r * s.cols + col] = saturate_to_f16(staged[warp][e / kElems][e % kElems]);
    }
    __syncwarp();  // staged is rewritten by the warp's next item
  }
}

__global__ void activations_to_f16_kernel(const float* __restrict__ x, __half* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = saturate_to_f16(x[i]);
  }
}

template <DType kType>
struct Untile {
  static void run(const WeightMatrix& w, int64_t row0, int64_t n_rows, __half* dst, cudaStream_t stream) {
    const TiledShape s = tiled_shape<kType>(w.rows, w.cols);
    const int64_t warps = (n_rows + kTileRows - 1) / kTileRows * s.n_chunks;  // a warp per (tile, chunk)
    untile_kernel<kType><<<grid_for(warps, kUntileWarps), kUntileWarps * kWarpSize, 0, stream>>>(
        static_cast<const uint8_t*>(w.data), s, row0, n_rows, dst);
    LAZYKV_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
              std::string("cuBLAS: ") + what + ": " + cublasGetStatusName(status));
}

TensorCoreGemm::TensorCoreGemm(cudaStream_t stream) : stream_(stream) {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  try {
    check_cublas(cublasSetStream(handle_, stream_), "cublasSetStream");
  } catch (...) {
    static_cast<void>(cublasDestroy(handle_));
    throw;
  }
}

TensorCoreGemm::~TensorCoreGemm() { static_cast<void>(cublasDestroy(handle_)); }

void TensorCoreGemm::reserve(int64_t max_rows, int64_t max_cols, int64_t max_batch) {
  const int64_t whole = (max_rows + kTileRows - 1) / kTileRows * kTileRows * max_cols;
  reserve_device(weights_, size_t(std::min(whole, std::max(kBlockElements, kTileRows * max_cols))));
  reserve_device(input_, size_t(max_batch * max_cols));
}

void TensorCoreGemm::run(const WeightMatrix& w, const float* x, int64_t batch, float* y) {
  require(matmul_supported(w.type) && w.rows >= 0 && w.cols > 0 && batch >= 0, "TensorCoreGemm: bad matrix");
  if (w.rows == 0 || batch == 0) return;
  // Blocks of whole tiles of rows that fit the scratch.
  const int64_t fit = int64_t(weights_.size()) / w.cols / kTileRows * kTileRows;
  require(fit >= kTileRows && batch * w.cols <= int64_t(input_.size()),
          "TensorCoreGemm: reserve() was not called for a matrix this wide or a batch this large");
  auto* weights = reinterpret_cast<__half*>(weights_.data());
  auto* input = reinterpret_cast<__half*>(input_.data());
  activations_to_f16_kernel<<<grid_for(batch * w.cols, 256), 256, 0, stream_>>>(x, input, batch * w.cols);
  LAZYKV_CUDA_CHECK_LAUNCH();
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t row0 = 0; row0 < w.rows; row0 += fit) {
    const int64_t n_rows = std::min(fit, w.rows - row0);
    with_tiled_type<Untile>(w.type, w, row0, n_rows, weights, stream_);
    // Column-major terms: Yᵀ[n_rows, batch] (ld rows) = W_blockᵀᵀ · Xᵀ, the
    // row-major W block being a col-major [cols, n_rows] and X a [cols, batch].
    check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(n_rows), int(batch), int(w.cols), &alpha,
                              weights, CUDA_R_16F, int(w.cols), input, CUDA_R_16F, int(w.cols), &beta, y + row0,
                              CUDA_R_32F, int(w.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }
}

}  // namespace lazykv::cuda
