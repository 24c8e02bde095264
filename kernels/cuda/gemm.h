// Prefill and large batches on the tensor cores, through cuBLAS: a weight
// matrix is dequantized from the tiled layout (ops.h) to f16 in a scratch
// buffer, a block of rows at a time, the activations are rounded to f16
// once, and the product is summed in f32 (inputs rounded to 10 mantissa
// bits, at twice TF32's rate and half its scratch traffic: a relative error
// near 1e-3 of Σ|w·x|, where the decode matmul's f32 arithmetic is exact to
// rounding). f16's range is narrower than f32's: inputs beyond ±65504
// saturate there rather than turn a whole row into inf (llama.cpp's cuBLAS
// path rounds to f16 as well). Worth it from
// kTensorCoreMinRows activation rows on, where the product is bound by
// arithmetic rather than by reading the weights.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {

constexpr int64_t kTensorCoreMinRows = 64;

// Throws for a failed cuBLAS call: Error(kOutOfMemory) for memory, else
// Error(kInternal) naming `what` and the status.
void check_cublas(cublasStatus_t status, const char* what);

class TensorCoreGemm {
 public:
  // Throws Error(kInternal) when cuBLAS cannot start (kOutOfMemory for memory).
  explicit TensorCoreGemm(cudaStream_t stream);
  ~TensorCoreGemm();
  TensorCoreGemm(const TensorCoreGemm&) = delete;
  TensorCoreGemm& operator=(const TensorCoreGemm&) = delete;

  // Allocates the scratch for matrices up to max_rows x max_cols (a block of
  // rows of up to 32 Mi weights, or 32 rows if more) and inputs of up to
  // max_batch rows, so run() never allocates.
  void reserve(int64_t max_rows, int64_t max_cols, int64_t max_batch);
  // y = x · wᵀ: x [batch, w.cols], y [batch, w.rows]; w of a matmul_supported type.
  void run(const WeightMatrix& w, const float* x, int64_t batch, float* y);

 private:
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  DeviceBuffer<uint16_t> weights_;  // f16: a block of w's rows
  DeviceBuffer<uint16_t> input_;    // f16: x
};

}  // namespace lazykv::cuda
