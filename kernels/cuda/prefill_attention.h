// Causal attention of a prefill chunk on the tensor cores, through cuBLAS:
// per cache head, its slots gathered from the pages into contiguous f16 K
// and V, S = scale·Q·Kᵀ for the head's query group (one batched GEMM, f16
// inputs, f32 sums), a masked row softmax to f16 P, and O = P·V (a second
// batched GEMM). Queries go in blocks whose scores fit the scratch, each
// block over only the slots its last token sees. For a long prompt the
// attention is then bound by the tensor cores instead of by one score per
// thread (attention_units). Probabilities round to f16 (about 1e-3 of each);
// no statistics are recorded, so only passes without a policy use it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_buffer.h"

namespace lazykv::cuda {

class PrefillAttention {
 public:
  // Throws Error(kInternal) when cuBLAS cannot start (kOutOfMemory for memory).
  explicit PrefillAttention(cudaStream_t stream);
  ~PrefillAttention();
  PrefillAttention(const PrefillAttention&) = delete;
  PrefillAttention& operator=(const PrefillAttention&) = delete;

  // Scratch for chunks of up to max_tokens tokens over up to max_slots slots,
  // n_group queries per token, so run() never allocates.
  void reserve(int64_t max_tokens, int32_t max_slots, int n_group, int head_dim);

  // One sequence's chunk, one cache head: token t's n_group queries at
  // q + t·q_stride (head after head, head_dim floats each), seeing the first
  // n_slots - (n_tokens - 1 - t) slots of the head's pages (cpu::KvPages
  // layout; the tables in device memory); out likewise at out + t·out_stride.
  void run(const float* q, int64_t q_stride, const uint16_t* const* keys, const uint16_t* const* values,
           int32_t page_slots, int32_t n_slots, int64_t n_tokens, int n_group, int head_dim, float scale, float* out,
           int64_t out_stride);

 private:
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  DeviceBuffer<uint16_t> keys_, values_, queries_, probs_;  // f16
  DeviceBuffer<float> scores_;
};

}  // namespace lazykv::cuda
