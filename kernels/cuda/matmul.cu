// y = x · Wᵀ from weights in the tiled layout (ops.h), f32 activations.
// Decode and small batches are bound by reading the weights once, so a warp
// owns 32 rows (a lane per row) and each load instruction fetches one 16-byte
// chunk per lane: 512 contiguous bytes per warp, every byte used. The lanes
// walk the same columns together, so each activation load is one broadcast.
// The warps of a block split the columns of the same 32 rows (no
// cross-block reduction: results are deterministic) and sum their partials
// in shared memory; each chunk is decoded once for up to kTok activation rows.
// Per weight the loop spends a byte permute, a subtraction and a multiply-add
// (the block's scales apply once per chunk: d·Σraw·x + m·Σx), and the next
// chunks' loads are issued before the current ones are decoded. With int8
// activations (matmul_q8, llama.cpp's arithmetic) a chunk is a few integer
// dot products (dp4a), a quarter of the instructions per weight.
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/block_formats.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/q8_block.h"
#include "kernels/cuda/tiled_format.h"

namespace lazykv::cuda {
namespace {

using namespace detail;

// Warps of a block, each a share of the tile's columns: 16 by default; 8
// where the matrices have tiles enough to fill the GPU with smaller blocks
// (kManyTiles); 32 for int8 activations at two rows or more, whose
// per-warp work is heavier. Measured on an H200 (docs/cuda.md): against 16,
// 8 warps take a layer's gate (448 tiles) from 17.5 to 13.1 us at batch 1
// with int8, and 32 warps its down from 65.5 to 40.0 us at batch 8; the f32
// kernel's registers leave 1024 threads spilling.
constexpr int kDefaultWarps = 16;
constexpr int64_t kManyTiles = 256;
// Chunks in flight per lane, by activation rows per pass: fewer with more
// rows, whose accumulators and activations take the registers (measured on
// an H200: at 8 rows the f32 kernel reads 4-bit weights 25% faster with one
// chunk than with two; at 1 row four chunks match or beat two; docs/cuda.md).
__host__ __device__ constexpr int f32_chunks_in_flight(int tok) { return tok == 1 ? 4 : tok <= 4 ? 2 : 1; }
__host__ __device__ constexpr int q8_chunks_in_flight(int tok) { return tok == 1 ? 4 : 2; }

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

// Σ x[k0 .. k0 + 32): Q4_1's m·Σx term, one 32-column block.
__device__ __forceinline__ float block_x_sum(const float* x, int64_t k0, bool x_vector) {
  float sum = 0.0f;
  if (x_vector) {
    const float4* x4 = reinterpret_cast<const float4*>(x + k0);
#pragma unroll
    for (int i = 0; i < cpu::kQK / 4; ++i) {
      const float4 v = x4[i];
      sum += (v.x + v.y) + (v.z + v.w);
    }
  } else {
#pragma unroll
    for (int i = 0; i < cpu::kQK; ++i) sum += x[k0 + i];
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

// A lane's next kCount chunks (and their scale entries) of [c, end).
template <DType kType, int kCount>
struct ChunkLoads {
  uint4 q[kCount];
  uint32_t scale[kCount];
  __device__ __forceinline__ void load(const uint8_t* chunks, const uint8_t* scales, int64_t c, int64_t end) {
    using Format = TiledFormat<kType>;
    constexpr int kChunksPerBlock = Format::kElems >= cpu::kQK ? 1 : cpu::kQK / Format::kElems;
#pragma unroll
    for (int u = 0; u < kCount; ++u) {
      if (c + u < end) {
        q[u] = *reinterpret_cast<const uint4*>(chunks + (c + u) * kTileChunkBytes);
        scale[u] = load_scale<kType>(scales + (c + u) / kChunksPerBlock * kTileRows * Format::kScaleBytes);
      }
    }
  }
};

// What warp `warp` of block (tile, token group) works on: its matrix of the
// group, its lane's row, its share [begin, end) of the tile's chunks.
struct WarpJob {
  const uint8_t* chunks;  // the lane's 16 bytes of the tile's chunk 0
  const uint8_t* scales;  // the lane's scale entry of the tile's block 0
  float* y;
  int64_t rows, tile, t0, begin, end;
  int n_tok;
};

template <DType kType, int kTok, int kWarps>
__device__ __forceinline__ WarpJob warp_job(const MatrixGroup& group, const TiledShape& s, int64_t batch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int m = 0;
  while (m + 1 < group.n && blockIdx.x >= group.tile_end[m]) ++m;
  WarpJob job;
  job.tile = blockIdx.x - (m == 0 ? 0 : group.tile_end[m - 1]);
  job.rows = group.rows[m];
  job.y = group.y[m];
  const int64_t row_tiles = (job.rows + kTileRows - 1) / kTileRows;
  const uint8_t* tiles = group.data[m];
  job.chunks = tiles + job.tile * s.n_chunks * kTileChunkBytes + lane * kChunkBytes;
  job.scales = tiles + row_tiles * s.n_chunks * kTileChunkBytes +
               (job.tile * s.n_blocks * kTileRows + lane) * TiledFormat<kType>::kScaleBytes;
  job.t0 = int64_t(blockIdx.y) * kTok;
  job.n_tok = static_cast<int>(batch - job.t0 < kTok ? batch - job.t0 : kTok);
  const int64_t per_warp = (s.n_chunks + kWarps - 1) / kWarps;
  job.begin = warp * per_warp;
  job.end = job.begin + per_warp < s.n_chunks ? job.begin + per_warp : s.n_chunks;
  return job;
}

// The block's warps add their partial sums of each row (in a fixed order:
// deterministic) and write y.
template <int kTok, int kWarps>
__device__ __forceinline__ void write_rows(const WarpJob& job, const float (&acc)[kTok],
                                           float (&partial)[kWarps][kTok][kTileRows]) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int t = 0; t < kTok; ++t) partial[warp][t][lane] = acc[t];
  __syncthreads();
  for (int i = threadIdx.x; i < kTok * kTileRows; i += blockDim.x) {
    const int t = i / kTileRows, r = i % kTileRows;
    const int64_t row = job.tile * kTileRows + r;
    if (t >= job.n_tok || row >= job.rows) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][t][r];
    job.y[(job.t0 + t) * job.rows + row] = sum;
  }
}

// f32 activations. Q4_1 needs Σx of each block: the chunks go in windows of
// 32, lane l sums chunk l's columns once for the warp and a shuffle hands
// each chunk's sum to every lane.
template <DType kType, int kTok, int kWarps>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    matmul_tiled_kernel(MatrixGroup group, TiledShape s, const float* __restrict__ x, int64_t batch, bool x_vector) {
  using Format = TiledFormat<kType>;
  constexpr int kElems = Format::kElems;
  constexpr int kInFlight = f32_chunks_in_flight(kTok);
  __shared__ float partial[kWarps][kTok][kTileRows];
  const int lane = threadIdx.x % kWarpSize;
  const WarpJob job = warp_job<kType, kTok, kWarps>(group, s, batch);
  const float* x0 = x + job.t0 * s.cols;
  const int64_t window = Format::kHasMin ? kWarpSize : job.end - job.begin;

  float acc[kTok] = {};
  for (int64_t w0 = job.begin; w0 < job.end; w0 += window) {
    const int64_t w_end = w0 + window < job.end ? w0 + window : job.end;
    float x_sum[kTok] = {};  // Q4_1: lane l's is chunk w0 + l's
    if constexpr (Format::kHasMin) {
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t < job.n_tok && w0 + lane < w_end) x_sum[t] = block_x_sum(x0 + t * s.cols, (w0 + lane) * kElems, x_vector);
      }
    }
    ChunkLoads<kType, kInFlight> now{};
    now.load(job.chunks, job.scales, w0, w_end);
    for (int64_t c = w0; c < w_end; c += kInFlight) {
      ChunkLoads<kType, kInFlight> next{};  // loading while `now` decodes
      if (c + kInFlight < w_end) next.load(job.chunks, job.scales, c + kInFlight, w_end);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (c + u >= w_end) break;  // warp-uniform: the shuffles below see every lane
        float w[kElems];
        Format::raw(now.q[u], w);
        const float d = Format::d(now.scale[u]);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t >= job.n_tok) break;
          const float dot = dot_chunk(w, x0 + t * s.cols, (c + u) * kElems, s.cols, x_vector);
          acc[t] = fmaf(d, dot, acc[t]);
          if constexpr (Format::kHasMin) {
            acc[t] = fmaf(Format::m(now.scale[u]), __shfl_sync(kFullMask, x_sum[t], int(c + u - w0)), acc[t]);
          }
        }
      }
      now = next;
    }
  }
  write_rows(job, acc, partial);
}

// Σ q·x over a chunk in integers: 4-bit chunks (a whole block: byte j holds
// elements j and j + 16) against the block's 32 activation bytes, Q8_0's
// half block against its 16.
template <DType kType>
__device__ __forceinline__ int chunk_dot_q8(uint4 q, const int8_t* xq) {
  const uint4 xa = *reinterpret_cast<const uint4*>(xq);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  const uint32_t xs[4] = {xa.x, xa.y, xa.z, xa.w};
  int sum = 0;
  if constexpr (kType == DType::kQ8_0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sum = __dp4a(int(words[i]), int(xs[i]), sum);
  } else {
    const uint4 xb = *reinterpret_cast<const uint4*>(xq + 16);
    const uint32_t xh[4] = {xb.x, xb.y, xb.z, xb.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sum = __dp4a(int(words[i] & 0x0F0F0F0Fu), int(xs[i]), sum);
      sum = __dp4a(int((words[i] >> 4) & 0x0F0F0F0Fu), int(xh[i]), sum);
    }
  }
  return sum;
}

// int8 activations (quantize_q8): integer dot products per chunk, each
// scaled once by the weight block's d (and m) and the activation block's d
// and s = d·Σq. Q4_0's offset: d_w·(d_x·Σq_w·q_x - 8·s_x).
template <DType kType, int kTok, int kWarps>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    matmul_q8_kernel(MatrixGroup group, TiledShape s, Q8Activations x, int64_t batch) {
  using Format = TiledFormat<kType>;
  constexpr int kElems = Format::kElems;
  constexpr int kChunksPerBlock = kElems >= cpu::kQK ? 1 : cpu::kQK / kElems;
  constexpr int kInFlight = q8_chunks_in_flight(kTok);
  __shared__ float partial[kWarps][kTok][kTileRows];
  const WarpJob job = warp_job<kType, kTok, kWarps>(group, s, batch);
  const int64_t blocks_per_row = s.cols / cpu::kQK;
  float acc[kTok] = {};
  for (int64_t c = job.begin; c < job.end; c += kInFlight) {
    ChunkLoads<kType, kInFlight> now{};
    now.load(job.chunks, job.scales, c, job.end);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (c + u >= job.end) break;
      const int64_t block = (c + u) / kChunksPerBlock;
      const float d = Format::d(now.scale[u]);
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t >= job.n_tok) break;
        const int64_t row = job.t0 + t;
        const int dot = chunk_dot_q8<kType>(now.q[u], x.q + row * s.cols + (c + u) * kElems);
        const float dx = x.d[row * blocks_per_row + block];
        if constexpr (kType == DType::kQ4_1) {
          acc[t] = fmaf(d * dx, float(dot), fmaf(Format::m(now.scale[u]), x.s[row * blocks_per_row + block], acc[t]));
        } else if constexpr (kType == DType::kQ4_0) {
          acc[t] = fmaf(d, fmaf(dx, float(dot), -8.0f * x.s[row * blocks_per_row + block]), acc[t]);
        } else {
          acc[t] = fmaf(d * dx, float(dot), acc[t]);
        }
      }
    }
  }
  write_rows(job, acc, partial);
}

// One warp per 32-column block of the rows (quantize_lanes_q8, a lane per element).
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t n_blocks, Q8Activations out) {
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize; b < n_blocks;
       b += int64_t(gridDim.x) * blockDim.x / kWarpSize) {
    const float v[1] = {x[b * kQ8Block + lane]};
    quantize_lanes_q8<1>(v, b * kQ8Block + lane, out);
  }
}

// The fewest activation rows per pass that cover the batch, up to 8 (more
// rows per pass would spill the accumulators): launch(integral_constant<int, kTok>).
template <class Launch>
void for_token_group(int64_t batch, Launch&& launch) {
  if (batch == 1) return launch(std::integral_constant<int, 1>{});
  if (batch == 2) return launch(std::integral_constant<int, 2>{});
  if (batch <= 4) return launch(std::integral_constant<int, 4>{});
  launch(std::integral_constant<int, 8>{});
}

dim3 matmul_grid(const MatrixGroup& group, int64_t batch, int tok) {
  const int64_t token_groups = (batch + tok - 1) / tok;
  const int64_t tiles = group.tile_end[group.n - 1];
  require(tiles < (int64_t(1) << 31) && token_groups < 65536, "cuda::matmul: shape too large");
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(token_groups));
}

bool many_tiles(const MatrixGroup& group) { return group.tile_end[group.n - 1] >= kManyTiles; }

template <DType kType>
void launch_matmul(const MatrixGroup& group, int64_t cols, const float* x, int64_t batch, cudaStream_t stream) {
  const TiledShape s = tiled_shape<kType>(0, cols);
  const bool x_vector = reinterpret_cast<uintptr_t>(x) % 16 == 0 && cols % 4 == 0;
  for_token_group(batch, [&](auto tok) {
    constexpr int kTok = decltype(tok)::value;
    const dim3 grid = matmul_grid(group, batch, kTok);
    if constexpr (kTok == 1) {
      if (many_tiles(group)) {
        matmul_tiled_kernel<kType, kTok, 8><<<grid, 8 * kWarpSize, 0, stream>>>(group, s, x, batch, x_vector);
        return;
      }
    }
    matmul_tiled_kernel<kType, kTok, kDefaultWarps>
        <<<grid, kDefaultWarps * kWarpSize, 0, stream>>>(group, s, x, batch, x_vector);
  });
  LAZYKV_CUDA_CHECK_LAUNCH();
}

template <DType kType>
void launch_matmul_q8(const MatrixGroup& group, int64_t cols, const Q8Activations& x, int64_t batch,
                      cudaStream_t stream) {
  const TiledShape s = tiled_shape<kType>(0, cols);
  for_token_group(batch, [&](auto tok) {
    constexpr int kTok = decltype(tok)::value;
    constexpr int kFewTilesWarps = kTok == 1 ? kDefaultWarps : 32;
    const dim3 grid = matmul_grid(group, batch, kTok);
    if (many_tiles(group)) {
      matmul_q8_kernel<kType, kTok, 8><<<grid, 8 * kWarpSize, 0, stream>>>(group, s, x, batch);
    } else {
      matmul_q8_kernel<kType, kTok, kFewTilesWarps><<<grid, kFewTilesWarps * kWarpSize, 0, stream>>>(group, s, x, batch);
    }
  });
  LAZYKV_CUDA_CHECK_LAUNCH();
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
    launch_matmul<kType>(g, cols, x, batch, stream);
  }
};

void check_shape(DType type, int64_t rows, int64_t cols) {
  require(matmul_supported(type), "cuda::matmul: unsupported weight type");
  require(rows >= 0 && cols > 0, "cuda::matmul: bad shape");
  require(static_cast<size_t>(cols) % dtype_traits(type).block_elems == 0,
          "cuda::matmul: cols is not a multiple of the block size");
  require(dtype_traits(type).block_elems == 1 || cols % cpu::kQK == 0, "cuda::matmul: cols is not a multiple of 32");
}

// The non-empty matrices of w[0, n) as one launch's group; all of one type and width.
MatrixGroup make_group(const WeightMatrix* w, float* const* y, int n) {
  require(n >= 1 && n <= MatrixGroup::kMax, "cuda::matmul_shared_input: 1 to 3 matrices");
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
  return group;
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
  require(batch >= 0, "cuda::matmul: bad shape");
  require(reinterpret_cast<uintptr_t>(x) % 4 == 0, "cuda::matmul: activations must be 4-byte aligned");
  const MatrixGroup group = make_group(w, y, n);
  if (group.n == 0 || batch == 0) return;
  with_tiled_type<Matmul>(w[0].type, group, w[0].cols, x, batch, stream);
}

void matmul(const WeightMatrix& w, const float* x, int64_t batch, float* y, cudaStream_t stream) {
  matmul_shared_input(&w, &y, 1, x, batch, stream);
}

bool matmul_q8_supported(DType type) {
  return type == DType::kQ8_0 || type == DType::kQ4_0 || type == DType::kQ4_1;
}

void quantize_q8(const float* x, int64_t batch, int64_t cols, const Q8Activations& out, cudaStream_t stream) {
  require(batch >= 0 && cols > 0 && cols % cpu::kQK == 0, "cuda::quantize_q8: cols must be a positive multiple of 32");
  require(reinterpret_cast<uintptr_t>(out.q) % 16 == 0, "cuda::quantize_q8: q must be 16-byte aligned");
  const int64_t n_blocks = batch * (cols / cpu::kQK);
  if (n_blocks == 0) return;
  constexpr int kThreads = 256;
  quantize_q8_kernel<<<grid_for(n_blocks * kWarpSize, kThreads), kThreads, 0, stream>>>(x, n_blocks, out);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

void matmul_q8_shared_input(const WeightMatrix* w, float* const* y, int n, const Q8Activations& x, int64_t batch,
                            cudaStream_t stream) {
  require(batch >= 0, "cuda::matmul_q8: bad shape");
  require(n >= 1 && matmul_q8_supported(w[0].type), "cuda::matmul_q8: weights must be Q4_0, Q4_1 or Q8_0");
  require(reinterpret_cast<uintptr_t>(x.q) % 16 == 0, "cuda::matmul_q8: activations must be 16-byte aligned");
  const MatrixGroup group = make_group(w, y, n);
  if (group.n == 0 || batch == 0) return;
  const int64_t cols = w[0].cols;
  switch (w[0].type) {
    case DType::kQ4_0: return launch_matmul_q8<DType::kQ4_0>(group, cols, x, batch, stream);
    case DType::kQ4_1: return launch_matmul_q8<DType::kQ4_1>(group, cols, x, batch, stream);
    default: return launch_matmul_q8<DType::kQ8_0>(group, cols, x, batch, stream);
  }
}

}  // namespace lazykv::cuda
