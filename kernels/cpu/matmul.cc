// y = x · Wᵀ: activations are quantized once into scratch, then output rows
// are split across the pool. Each thread walks its rows in tiles of
// kTileRows, and for each tile all tokens of a cache-sized chunk in tiles of
// kTileTokens, so a weight block is loaded once per several tokens and an
// activation block once per several rows (the prefill case), while batch 1
// streams every weight byte exactly once (the memory-bound decode case).
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cpu/kquant_planes.h"
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/matmul_f32.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h"
#include "kernels/cpu/row_chunks.h"

namespace lazykv::cpu {
namespace {

constexpr size_t kScratchAlign = 64;

// Activations of this many bytes stay in L2 while a tile of weight rows runs
// over them.
constexpr size_t kActChunkBytes = 256 * 1024;

// Multiply-adds below which a piece of work is not worth handing to another
// thread (a hand-off costs about a microsecond).
constexpr int64_t kMinParallelMacs = 64 * 1024;

size_t act_row_stride(const WeightMatrix& w) {
  const size_t bytes = row_bytes(vec_dot_type(w.type), static_cast<size_t>(w.cols));
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

void check_shape(const WeightMatrix& w) {
  const size_t block = dtype_traits(w.type).block_elems;
  if (w.rows < 0 || w.cols < 0 || static_cast<size_t>(w.cols) % block != 0) {
    throw Error(ErrorCode::kInternal, "matmul: " + std::to_string(w.rows) + "x" + std::to_string(w.cols) +
                                          " matrix does not fit the " + std::string(dtype_traits(w.type).name) +
                                          " block size");
  }
}

}  // namespace

// With int8 activations, the K-quant decode kernels of AVX-512 VNNI
// builds run one plane (kquant_planes.h): the exact mode's kernels with the
// 8-bit rounding of llama.cpp's Q8_K, faster than the integer tiles here.
static_assert(kKQuantPlanesMaxTokens <= kInt8KQuantMaxTokens, "int8 planes run only where int8 would");
static bool int8_runs_planes(const WeightMatrix& w, int64_t batch, ActivationPrecision precision) {
  return precision == ActivationPrecision::kInt8 && kquant_planes_take(w.type, int(batch));
}

// With int8 activations too for K-quant weights past kInt8KQuantMaxTokens:
// their integer tiles unpack a row's super-block once per tile of 4 tokens,
// while the f32 panels dequantize a panel once for the whole chunk, and were
// faster at 64 tokens (1536x768, 2 threads: Q4_K 1.15 against 1.55-1.90 ms,
// Q6_K 1.17-1.21 against 1.64-1.93); up to 8 tokens the tiles were level or
// faster (docs/engine.md, "int8 K-quant tiles").
// And with int8 activations for every type past kFusedStreamMaxTokens where
// the AMX tiles run (matmul_amx.h): exact and faster than the int8 tiles
// (SmolLM2's prefill of 512 tokens: 914 against 363 tok/s).
bool matmul_runs_f32(const WeightMatrix& w, int64_t batch, ActivationPrecision precision) {
  if (precision == ActivationPrecision::kF32) return true;
  if (int8_runs_planes(w, batch, precision)) return false;
  if (batch > kFusedStreamMaxTokens && matmul_amx_takes(w, batch)) return true;
  const bool k_quant = w.type == DType::kQ4_K || w.type == DType::kQ6_K;
  // Without tiles (no SIMD) int8 K-quants go one pair at a time, slower than f32 from 3 tokens.
  return k_quant && batch > (simd::has_dot_tile(w.type) ? kInt8KQuantMaxTokens : 2);
}

size_t matmul_scratch_bytes(const WeightMatrix& w, int64_t batch, int n_threads, ActivationPrecision precision) {
  if (batch <= 0) return 0;
  if (int8_runs_planes(w, batch, precision)) {
    return size_t(std::max(1, n_threads)) * kquant_planes_scratch_bytes(w.cols, int(batch), KQuantPlanes::kInt8);
  }
  if (matmul_runs_f32(w, batch, precision)) return matmul_f32_scratch_bytes(w, batch, n_threads);
  if (vec_dot_type(w.type) == DType::kF32) return 0;  // f32 activations are used in place
  return static_cast<size_t>(batch) * act_row_stride(w);
}

void matmul(const WeightMatrix& w, const float* x, int64_t batch, float* y, void* scratch, ThreadPool& pool,
            ActivationPrecision precision) {
  check_shape(w);
  if (batch <= 0 || w.rows == 0) return;  // also keeps the f32 kernels' token count in 1..
  if (int8_runs_planes(w, batch, precision)) {  // before matmul_runs_f32, as matmul_scratch_bytes sizes it
    const size_t per_thread = kquant_planes_scratch_bytes(w.cols, int(batch), KQuantPlanes::kInt8);
    RowChunks rows(0, w.rows, pool.size());
    pool.run([&](int thread, int) {
      uint8_t* own = static_cast<uint8_t*>(scratch) + per_thread * size_t(thread);
      kquant_planes_rows(w, rows, x, int(batch), y, w.rows, own, KQuantPlanes::kInt8);
    });
    return;
  }
  if (matmul_runs_f32(w, batch, precision)) {
    matmul_f32(w, x, batch, y, static_cast<float*>(scratch), pool);
    return;
  }
  const int64_t rows = w.rows, cols = w.cols;
  const DType act_type = vec_dot_type(w.type);

  const uint8_t* acts;
  size_t act_stride;
  if (act_type == DType::kF32) {
    acts = reinterpret_cast<const uint8_t*>(x);
    act_stride = static_cast<size_t>(cols) * sizeof(float);
  } else {
    act_stride = act_row_stride(w);
    auto* dst = static_cast<uint8_t*>(scratch);
    auto quantize = [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) quantize_row(act_type, x + b * cols, dst + b * act_stride, cols);
    };
    if (batch * cols < kMinParallelMacs) {
      quantize(0, batch);
    } else {
      pool.parallel_for(batch, std::max<int64_t>(1, kMinParallelMacs / std::max<int64_t>(cols, 1)), quantize);
    }
    acts = dst;
  }

  const auto* weights = static_cast<const uint8_t*>(w.data);
  const size_t w_stride = row_bytes(w.type, static_cast<size_t>(cols));
  const size_t y_stride = static_cast<size_t>(rows);
  const bool tiled = simd::has_dot_tile(w.type);
  const int64_t token_chunk = std::clamp<int64_t>(
      static_cast<int64_t>(kActChunkBytes / act_stride) / simd::kTileTokens * simd::kTileTokens,
      simd::kTileTokens, std::max<int64_t>(batch, simd::kTileTokens));

  // Work on row tiles [tile_begin, tile_end); tile boundaries keep every
  // thread's rows aligned to kTileRows.
  auto compute = [&](int64_t tile_begin, int64_t tile_end) {
    const int64_t r_begin = tile_begin * simd::kTileRows;
    const int64_t r_end = std::min(rows, tile_end * simd::kTileRows);
    for (int64_t t_begin = 0; t_begin < batch; t_begin += token_chunk) {
      const int64_t t_end = std::min(batch, t_begin + token_chunk);
      if (tiled) {
        for (int64_t r = r_begin; r < r_end; r += simd::kTileRows) {
          const int n_rows = static_cast<int>(std::min<int64_t>(simd::kTileRows, r_end - r));
          for (int64_t t = t_begin; t < t_end; t += simd::kTileTokens) {
            const int n_tokens = static_cast<int>(std::min<int64_t>(simd::kTileTokens, t_end - t));
            simd::dot_tile(w.type, cols, weights + r * w_stride, w_stride, n_rows, acts + t * act_stride,
                           act_stride, n_tokens, y + t * y_stride + r, y_stride);
          }
        }
      } else {
        for (int64_t r = r_begin; r < r_end; ++r) {
          for (int64_t t = t_begin; t < t_end; ++t) {
            y[t * y_stride + r] = vec_dot(w.type, cols, weights + r * w_stride, acts + t * act_stride);
          }
        }
      }
    }
  };

  const int64_t n_tiles = (rows + simd::kTileRows - 1) / simd::kTileRows;
  const int64_t macs_per_tile = simd::kTileRows * cols * batch;
  const int64_t grain = std::max<int64_t>(1, kMinParallelMacs / std::max<int64_t>(macs_per_tile, 1));
  pool.parallel_for(n_tiles, grain, compute);
}

}  // namespace lazykv::cpu
