// y = x · Wᵀ from weights in the tiled layout (ops.h), f32 activations.
// Decode and small batches are bound by reading the weights once, so a warp
// owns 32 rows (a lane per row) and each load instruction fetches one 16-byte
// chunk per lane: 512 contiguous bytes per warp, every byte used. The lanes
// walk the same columns together, so each activation load is one broadcast.
// The warps of a block split the columns of the same 32 rows (no
// cross-block reduction: results are deterministic) and sum their partials
// in shared memory; each chunk is decoded once for up to kTok activation rows.
#include <cstdint>

#include "kernels/cuda/block_formats.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/tiled_format.h"

namespace lazykv::cuda {
namespace {

using namespace detail;

constexpr int kSplitWarps = 16;   // warps of a block, each a share of the columns
constexpr int kUnroll = 4;        // chunks a lane loads before decoding: bytes in flight

// Σ w[i]·x[i] over a chunk's kElems columns starting at column k0; the tail
// past `cols` (an F16/BF16 row not a multiple of 8) is read as zeros.
template <int kElems>
__device__ __forceinline__ float dot_chunk(const float (&w)[kElems], const float* x, int64_t k0, int64_t cols,
                                           bool x_vector) {
  float sum = 0.0f;
  if (x_vector && k0 + kElems <= cols) {
    const float4* x4 = reinterpret_cast<const float4*>(x + k0);
#pragma unroll
    for (int i = 0; i < kElems / 4; ++i) {
      const float4 v = x4[i];
      sum = fmaf(w[4 * i], v.x, sum);
      sum = fmaf(w[4 * i + 1], v.y, sum);
      sum = fmaf(w[4 * i + 2], v.z, sum);
      sum = fmaf(w[4 * i + 3], v.w, sum);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      if (k0 + i < cols) sum = fmaf(w[i], x[k0 + i], sum);
    }
  }
  return sum;
}

// Matrices of one type and width on the same activations, one launch: the
// blocks before tile_end[0] work on matrix 0, then up to tile_end[1] on 1, ...
// (a layer's K and V alone are too few tiles to fill the GPU).
struct MatrixGroup {
  static constexpr int kMax = 3;
  const uint8_t* data[kMax];
  float* y[kMax];
  int64_t rows[kMax];
  int64_t tile_end[kMax];
  int n;
};

// Block (tile, token group): warp w takes its share of the tile's chunks.
template <DType kType, int kTok>
__global__ void __launch_bounds__(kSplitWarps* kWarpSize)
    matmul_tiled_kernel(MatrixGroup group, TiledShape s, const float* __restrict__ x, int64_t batch, bool x_vector) {
  using Format = TiledFormat<kType>;
  constexpr int kElems = Format::kElems;
  constexpr int kChunksPerBlock = kElems >= cpu::kQK ? 1 : cpu::kQK / kElems;
  __shared__ float partial[kSplitWarps][kTok][kTileRows];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int m = 0;
  while (m + 1 < group.n && blockIdx.x >= group.tile_end[m]) ++m;
  const int64_t tile = blockIdx.x - (m == 0 ? 0 : group.tile_end[m - 1]);
  s.rows = group.rows[m];
  s.row_tiles = (s.rows + kTileRows - 1) / kTileRows;
  const uint8_t* __restrict__ tiles = group.data[m];
  float* __restrict__ y = group.y[m];
  const int64_t t0 = int64_t(blockIdx.y) * kTok;
  const int n_tok = static_cast<int>(batch - t0 < kTok ? batch - t0 : kTok);
  const uint8_t* chunks = tiles + tile * s.n_chunks * kTileChunkBytes + lane * kChunkBytes;
  const uint8_t* scales = tiles + s.row_tiles * s.n_chunks * kTileChunkBytes +
                          (tile * s.n_blocks * kTileRows + lane) * Format::kScaleBytes;
  const float* x0 = x + t0 * s.cols;
  const int64_t per_warp = (s.n_chunks + kSplitWarps - 1) / kSplitWarps;
  const int64_t begin = warp * per_warp;
  const int64_t end = begin + per_warp < s.n_chunks ? begin + per_warp : s.n_chunks;

  float acc[kTok] = {};
  for (int64_t c = begin; c < end; c += kUnroll) {
    uint4 q[kUnroll];
    uint32_t scale[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // every load first: kUnroll chunks in flight
      if (c + u < end) {
        q[u] = *reinterpret_cast<const uint4*>(chunks + (c + u) * kTileChunkBytes);
        scale[u] = load_scale<kType>(scales + (c + u) / kChunksPerBlock * kTileRows * Format::kScaleBytes);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + u < end) {
        float w[kElems];
        Format::decode(q[u], scale[u], w);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t < n_tok) acc[t] += dot_chunk(w, x0 + t * s.cols, (c + u) * kElems, s.cols, x_vector);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTok; ++t) partial[warp][t][lane] = acc[t];
  __syncthreads();
  for (int i = threadIdx.x; i < kTok * kTileRows; i += blockDim.x) {
    const int t = i / kTileRows, r = i % kTileRows;
    const int64_t row = tile * kTileRows + r;
    if (t >= n_tok || row >= s.rows) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) sum += partial[w][t][r];
    y[(t0 + t) * s.rows + row] = sum;
  }
}

template <DType kType, int kTok>
void launch_matmul(const MatrixGroup& group, int64_t cols, const float* x, int64_t batch, cudaStream_t stream) {
  const TiledShape s = tiled_shape<kType>(0, cols);
  const int64_t token_groups = (batch + kTok - 1) / kTok;
  const int64_t tiles = group.tile_end[group.n - 1];
  require(tiles < (int64_t(1) << 31) && token_groups < 65536, "cuda::matmul: shape too large");
  const bool x_vector = reinterpret_cast<uintptr_t>(x) % 16 == 0 && cols % 4 == 0;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(token_groups));
  matmul_tiled_kernel<kType, kTok><<<grid, kSplitWarps * kWarpSize, 0, stream>>>(group, s, x, batch, x_vector);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

// The fewest activation rows per pass that cover the batch, up to 8 (more
// rows per pass would spill the accumulators).
template <DType kType>
void dispatch_tokens(const MatrixGroup& g, int64_t cols, const float* x, int64_t batch, cudaStream_t stream) {
  if (batch == 1) return launch_matmul<kType, 1>(g, cols, x, batch, stream);
  if (batch == 2) return launch_matmul<kType, 2>(g, cols, x, batch, stream);
  if (batch <= 4) return launch_matmul<kType, 4>(g, cols, x, batch, stream);
  launch_matmul<kType, 8>(g, cols, x, batch, stream);
}

// One thread per (row, chunk) of the tiled layout, padding included: copies
// the chunk's bytes from the GGML row (zeros past the matrix) and, for the
// block's first chunk, its scale entry. Load time only, so bytewise.
template <DType kType>
__global__ void tile_kernel(const uint8_t* __restrict__ src, TiledShape s, int64_t src_row_bytes, int block_bytes,
                            uint8_t* __restrict__ dst) {
  using Format = TiledFormat<kType>;
  constexpr int kElems = Format::kElems;
  constexpr int kChunksPerBlock = kElems >= cpu::kQK ? 1 : cpu::kQK / kElems;
  const int64_t total = s.row_tiles * kTileRows * s.n_chunks;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / s.n_chunks, c = i % s.n_chunks;
    const int64_t tile = row / kTileRows, lane = row % kTileRows;
    uint8_t* out = dst + (tile * s.n_chunks + c) * kTileChunkBytes + lane * kChunkBytes;
    const uint8_t* in_row = src + row * src_row_bytes;
    int64_t from = 0, available = 0;  // the chunk's bytes in the GGML row
    if constexpr (Format::kScaleBytes == 0) {
      from = c * kChunkBytes;
      available = src_row_bytes - from;
    } else {
      const int64_t block = c / kChunksPerBlock;
      const int quants_at = kType == DType::kQ4_1 ? 4 : 2;  // after d (and m)
      from = block * block_bytes + quants_at + (c % kChunksPerBlock) * kChunkBytes;
      available = kChunkBytes;
      if (c % kChunksPerBlock == 0) {
        uint8_t* entry = dst + s.row_tiles * s.n_chunks * kTileChunkBytes +
                         ((tile * s.n_blocks + block) * kTileRows + lane) * Format::kScaleBytes;
        for (int b = 0; b < Format::kScaleBytes; ++b) {
          entry[b] = row < s.rows ? in_row[block * block_bytes + b] : 0;
        }
      }
    }
    for (int b = 0; b < kChunkBytes; ++b) out[b] = row < s.rows && b < available ? in_row[from + b] : 0;
  }
}

template <DType kType>
void launch_tile(const void* src, int64_t rows, int64_t cols, void* dst, cudaStream_t stream) {
  const TiledShape s = tiled_shape<kType>(rows, cols);
  constexpr int kThreads = 256;
  tile_kernel<kType><<<grid_for(s.row_tiles * kTileRows * s.n_chunks, kThreads), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(src), s, static_cast<int64_t>(row_bytes(kType, size_t(cols))),
      static_cast<int>(dtype_traits(kType).block_bytes), static_cast<uint8_t*>(dst));
  LAZYKV_CUDA_CHECK_LAUNCH();
}

template <DType kType>
struct TiledBytes {
  static size_t run(int64_t rows, int64_t cols) { return tiled_bytes_of<kType>(rows, cols); }
};

template <DType kType>
struct Tile {
  static void run(const void* src, int64_t rows, int64_t cols, void* dst, cudaStream_t stream) {
    launch_tile<kType>(src, rows, cols, dst, stream);
  }
};

template <DType kType>
struct Matmul {
  static void run(const MatrixGroup& g, int64_t cols, const float* x, int64_t batch, cudaStream_t stream) {
    dispatch_tokens<kType>(g, cols, x, batch, stream);
  }
};

void check_shape(DType type, int64_t rows, int64_t cols) {
  require(matmul_supported(type), "cuda::matmul: unsupported weight type");
  require(rows >= 0 && cols > 0, "cuda::matmul: bad shape");
  require(static_cast<size_t>(cols) % dtype_traits(type).block_elems == 0,
          "cuda::matmul: cols is not a multiple of the block size");
  require(dtype_traits(type).block_elems == 1 || cols % cpu::kQK == 0, "cuda::matmul: cols is not a multiple of 32");
}

}  // namespace

bool matmul_supported(DType type) {
  return type == DType::kF16 || type == DType::kBF16 || type == DType::kQ8_0 || type == DType::kQ4_0 ||
         type == DType::kQ4_1;
}

size_t tiled_bytes(DType type, int64_t rows, int64_t cols) {
  check_shape(type, rows, cols);
  return with_tiled_type<TiledBytes>(type, rows, cols);
}

void tile_weights(DType type, const void* src, int64_t rows, int64_t cols, void* tiled, cudaStream_t stream) {
  check_shape(type, rows, cols);
  require(reinterpret_cast<uintptr_t>(src) % 4 == 0, "cuda::tile_weights: rows must be 4-byte aligned");
  require(reinterpret_cast<uintptr_t>(tiled) % 16 == 0, "cuda::tile_weights: the tiled buffer must be 16-byte aligned");
  if (rows == 0) return;
  with_tiled_type<Tile>(type, src, rows, cols, tiled, stream);
}

void matmul_shared_input(const WeightMatrix* w, float* const* y, int n, const float* x, int64_t batch,
                         cudaStream_t stream) {
  require(n >= 1 && n <= MatrixGroup::kMax, "cuda::matmul_shared_input: 1 to 3 matrices");
  require(batch >= 0, "cuda::matmul: bad shape");
  require(reinterpret_cast<uintptr_t>(x) % 4 == 0, "cuda::matmul: activations must be 4-byte aligned");
  MatrixGroup group{};
  int64_t tiles = 0;
  for (int i = 0; i < n; ++i) {
    check_shape(w[i].type, w[i].rows, w[i].cols);
    require(w[i].type == w[0].type && w[i].cols == w[0].cols,
            "cuda::matmul_shared_input: the matrices differ in type or width");
    require(reinterpret_cast<uintptr_t>(w[i].data) % 16 == 0, "cuda::matmul: tiled weights must be 16-byte aligned");
    if (w[i].rows == 0) continue;
    group.data[group.n] = static_cast<const uint8_t*>(w[i].data);
    group.y[group.n] = y[i];
    group.rows[group.n] = w[i].rows;
    tiles += (w[i].rows + kTileRows - 1) / kTileRows;
    group.tile_end[group.n++] = tiles;
  }
  if (group.n == 0 || batch == 0) return;
  with_tiled_type<Matmul>(w[0].type, group, w[0].cols, x, batch, stream);
}

void matmul(const WeightMatrix& w, const float* x, int64_t batch, float* y, cudaStream_t stream) {
  matmul_shared_input(&w, &y, 1, x, batch, stream);
}

}  // namespace lazykv::cuda
