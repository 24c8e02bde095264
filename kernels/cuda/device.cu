// Device discovery.
#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {

bool cuda_device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // clear the error so later calls start clean
    return false;
  }
  return count > 0;
}

int usable_device_count() {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    throw Error(ErrorCode::kUnavailable, std::string("no CUDA device is usable (") + cudaGetErrorName(e) + ": " +
                                             cudaGetErrorString(e) + ")");
  }
  if (count < 1) throw Error(ErrorCode::kUnavailable, "no CUDA device is usable (0 devices)");
  return count;
}

double measure_copy_rate() {
  constexpr size_t kBytes = size_t(1) << 30;
  DeviceBuffer<uint8_t> source(kBytes), target(kBytes);
  LAZYKV_CUDA_CHECK(cudaMemset(source.data(), 1, kBytes));
  cudaEvent_t start = nullptr, stop = nullptr;
  LAZYKV_CUDA_CHECK(cudaEventCreate(&start));
  LAZYKV_CUDA_CHECK(cudaEventCreate(&stop));
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {  // the first also warms the copy engine up
    LAZYKV_CUDA_CHECK(cudaEventRecord(start));
    LAZYKV_CUDA_CHECK(cudaMemcpy(target.data(), source.data(), kBytes, cudaMemcpyDeviceToDevice));
    LAZYKV_CUDA_CHECK(cudaEventRecord(stop));
    LAZYKV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    LAZYKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (ms > 0) best = std::max(best, double(kBytes) / (double(ms) * 1e-3));
  }
  static_cast<void>(cudaEventDestroy(start));
  static_cast<void>(cudaEventDestroy(stop));
  return best;
}

}  // namespace lazykv::cuda
