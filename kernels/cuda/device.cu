// Device discovery.
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

}  // namespace lazykv::cuda
