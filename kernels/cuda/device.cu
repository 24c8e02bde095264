// Device discovery.
#include <string>

#include "common/error.h"
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

}  // namespace lazykv::cuda
