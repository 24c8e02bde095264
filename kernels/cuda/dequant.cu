// Rows of any supported weight format to f32. One thread per output element
// (consecutive threads write consecutive floats); the few bytes of scales a
// block's threads share come from L1.
#include <cstdint>

#include "kernels/cuda/block_formats.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;

// Rows are contiguous and n is a multiple of the block, so n_rows rows are
// one flat run of blocks.
template <DType kType>
__global__ void dequantize_kernel(const uint8_t* __restrict__ src, float* __restrict__ dst, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (kType == DType::kF32) {
      dst[i] = reinterpret_cast<const float*>(src)[i];
    } else if constexpr (kType == DType::kF16) {
      dst[i] = f16_bits_to_float(reinterpret_cast<const uint16_t*>(src)[i]);
    } else if constexpr (kType == DType::kBF16) {
      dst[i] = bf16_bits_to_float(reinterpret_cast<const uint16_t*>(src)[i]);
    } else if constexpr (kType == DType::kQ4_0) {
      dst[i] = decode_q4_0(src + (i / cpu::kQK) * kQ4_0Bytes, static_cast<int>(i % cpu::kQK));
    } else if constexpr (kType == DType::kQ4_1) {
      dst[i] = decode_q4_1(src + (i / cpu::kQK) * kQ4_1Bytes, static_cast<int>(i % cpu::kQK));
    } else if constexpr (kType == DType::kQ8_0) {
      dst[i] = decode_q8_0(src + (i / cpu::kQK) * kQ8_0Bytes, static_cast<int>(i % cpu::kQK));
    } else if constexpr (kType == DType::kQ4_K) {
      dst[i] = decode_q4_k(src + (i / cpu::kQK_K) * kQ4_KBytes, static_cast<int>(i % cpu::kQK_K));
    } else {
      static_assert(kType == DType::kQ6_K);
      dst[i] = decode_q6_k(src + (i / cpu::kQK_K) * kQ6_KBytes, static_cast<int>(i % cpu::kQK_K));
    }
  }
}

template <DType kType>
void launch(const void* src, float* dst, int64_t total, cudaStream_t stream) {
  dequantize_kernel<kType>
      <<<grid_for(total, kThreads), kThreads, 0, stream>>>(static_cast<const uint8_t*>(src), dst, total);
  LAZYKV_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool dequantize_supported(DType type) {
  switch (type) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kQ4_0: case DType::kQ4_1:
    case DType::kQ8_0: case DType::kQ4_K: case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void dequantize_rows(DType type, const void* src, float* dst, int64_t n_rows, int64_t n, cudaStream_t stream) {
  require(dequantize_supported(type), "dequantize_rows: unsupported type");
  require(n_rows >= 0 && n >= 0, "dequantize_rows: bad shape");
  require(static_cast<size_t>(n) % dtype_traits(type).block_elems == 0,
          "dequantize_rows: row length is not a multiple of the block size");
  const uintptr_t align = type == DType::kF32 ? 4 : 2;
  require(reinterpret_cast<uintptr_t>(src) % align == 0, "dequantize_rows: misaligned source");
  const int64_t total = n_rows * n;
  if (total == 0) return;
  switch (type) {
    case DType::kF32: return launch<DType::kF32>(src, dst, total, stream);
    case DType::kF16: return launch<DType::kF16>(src, dst, total, stream);
    case DType::kBF16: return launch<DType::kBF16>(src, dst, total, stream);
    case DType::kQ4_0: return launch<DType::kQ4_0>(src, dst, total, stream);
    case DType::kQ4_1: return launch<DType::kQ4_1>(src, dst, total, stream);
    case DType::kQ8_0: return launch<DType::kQ8_0>(src, dst, total, stream);
    case DType::kQ4_K: return launch<DType::kQ4_K>(src, dst, total, stream);
    case DType::kQ6_K: return launch<DType::kQ6_K>(src, dst, total, stream);
    default: break;
  }
}

}  // namespace lazykv::cuda
