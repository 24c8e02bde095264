// y = x · Wᵀ on quantized weights, multi-threaded. Weights are used in place
// (no dequantized copy); activations are quantized once per call into a
// caller-owned scratch buffer, so the kernel never allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/thread_pool.h"

namespace lazykv::cpu {

// A row-major weight matrix: `rows` output features, each a row of `cols`
// input features stored contiguously in `type`.
struct WeightMatrix {
  DType type = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;  // [rows][row_bytes(type, cols)]
};

// Bytes of scratch matmul() needs for `batch` activation rows against w.
size_t matmul_scratch_bytes(const WeightMatrix& w, int64_t batch);

// x: [batch][w.cols] f32, y: [batch][w.rows] f32 (y[b][r] = Σ_k w[r][k]·x[b][k]).
// scratch: at least matmul_scratch_bytes(w, batch) bytes, 64-byte aligned.
void matmul(const WeightMatrix& w, const float* x, int64_t batch, float* y, void* scratch,
            ThreadPool& pool);

}  // namespace lazykv::cpu
