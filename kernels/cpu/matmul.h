// y = x · Wᵀ on quantized weights, multi-threaded. Weights are used in place
// (no dequantized copy of the matrix); the kernel never allocates: its
// working memory is a caller-owned scratch buffer.
//
// Two activation precisions:
// - kF32 (default): activations stay f32, weights are dequantized on the fly;
//   results match an fp32 reference to rounding error.
// - kInt8: activations are quantized to 8 bits per 32-element block (Q8_0,
//   Q8_1, Q8_K) and multiplied with integer dot products, as llama.cpp does:
//   less exact (about 2% of next-token argmaxes flip on SmolLM2). Q4_K and
//   Q6_K weights take the kF32 path past kInt8KQuantMaxTokens tokens (prefill
//   chunks, batches of more than 8), where it is faster (matmul_runs_f32);
//   up to there, on AVX-512 VNNI builds, the one-plane kernels of
//   kquant_planes.h. On CPUs with AMX tiles every type takes the kF32 path
//   past 64 tokens (matmul_amx.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/thread_pool.h"

namespace lazykv::cpu {

// The most tokens a K-quant product runs with int8 activations where the
// build has integer tiles (AVX2); past it the f32 kernels run (matmul.cc).
inline constexpr int64_t kInt8KQuantMaxTokens = 8;

// A row-major weight matrix: `rows` output features, each a row of `cols`
// input features stored contiguously in `type`.
struct WeightMatrix {
  DType type = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;  // [rows][row_bytes(type, cols)]
};

enum class ActivationPrecision { kF32, kInt8 };

// Whether matmul() runs this product on the f32 kernels: always with f32
// activations; with int8 for K-quant products past their token limit.
bool matmul_runs_f32(const WeightMatrix& w, int64_t batch, ActivationPrecision precision);

// Bytes of scratch matmul() needs for `batch` activation rows against w on a
// pool of n_threads.
size_t matmul_scratch_bytes(const WeightMatrix& w, int64_t batch, int n_threads,
                            ActivationPrecision precision = ActivationPrecision::kF32);

// x: [batch][w.cols] f32, y: [batch][w.rows] f32 (y[b][r] = Σ_k w[r][k]·x[b][k]).
// scratch: at least matmul_scratch_bytes(w, batch, pool.size(), precision)
// bytes, 64-byte aligned.
void matmul(const WeightMatrix& w, const float* x, int64_t batch, float* y, void* scratch,
            ThreadPool& pool, ActivationPrecision precision = ActivationPrecision::kF32);

}  // namespace lazykv::cpu
