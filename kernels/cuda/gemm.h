// Prefill and large batches on the tensor cores, through cuBLAS: a weight
// matrix is dequantized from the tiled layout (ops.h) to f32 in a scratch
// buffer, a block of rows at a time, and multiplied as TF32 (f32 range and
// sums, inputs rounded to 10 mantissa bits: a relative error near 1e-3 of
// Σ|w·x|, where the decode matmul's f32 arithmetic is exact to rounding).
// Worth it from kTensorCoreMinRows activation rows on, where the product is
// bound by arithmetic rather than by reading the weights.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {

constexpr int64_t kTensorCoreMinRows = 64;

class TensorCoreGemm {
 public:
  // Throws Error(kInternal) when cuBLAS cannot start (kOutOfMemory for memory).
  explicit TensorCoreGemm(cudaStream_t stream);
  ~TensorCoreGemm();
  TensorCoreGemm(const TensorCoreGemm&) = delete;
  TensorCoreGemm& operator=(const TensorCoreGemm&) = delete;

  // Allocates the scratch for matrices up to max_rows x max_cols (a block of
  // rows of up to 16 Mi weights, or 32 rows if more), so run() never allocates.
  void reserve(int64_t max_rows, int64_t max_cols);
  // y = x · wᵀ: x [batch, w.cols], y [batch, w.rows]; w of a matmul_supported type.
  void run(const WeightMatrix& w, const float* x, int64_t batch, float* y);

 private:
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  DeviceBuffer<float> scratch_;
};

}  // namespace lazykv::cuda
