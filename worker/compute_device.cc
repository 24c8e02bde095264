#include "worker/compute_device.h"

#include <string>

#include "common/error.h"
#ifdef LAZYKV_HAVE_CUDA
#include "kernels/cuda/ops.h"
#include "worker/cuda/cuda_forward.h"
#endif

namespace lazykv {

ComputeDevice parse_compute_device(std::string_view name) {
  if (name == "cpu") return ComputeDevice::kCpu;
  if (name == "cuda") return ComputeDevice::kCuda;
  throw Error(ErrorCode::kInvalidArgument, "unknown device '" + std::string(name) + "': use cpu or cuda");
}

const char* compute_device_name(ComputeDevice device) { return device == ComputeDevice::kCuda ? "cuda" : "cpu"; }

bool cuda_backend_built() {
#ifdef LAZYKV_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int pick_cuda_device(int cuda_device, int rank, const std::string& who) {
  if (cuda_device < -1) {
    throw Error(ErrorCode::kInvalidArgument, "--cuda-device must be >= 0, or -1 for rank modulo the devices");
  }
#ifdef LAZYKV_HAVE_CUDA
  int devices = 0;
  try {
    devices = cuda::usable_device_count();
  } catch (const Error& e) {
    throw Error(e.code(), who + ": " + e.what());
  }
  if (cuda_device < 0) return rank % devices;
  if (cuda_device >= devices) {
    throw Error(ErrorCode::kUnavailable, "--cuda-device " + std::to_string(cuda_device) + " does not exist: " +
                                             std::to_string(devices) + " CUDA device(s) are usable");
  }
  return cuda_device;
#else
  (void)rank;
  throw Error(ErrorCode::kUnavailable,
              who + ": this lazykv was built without the CUDA backend (CMake found no CUDA toolkit)");
#endif
}

int check_compute_device(ComputeDevice device, int cuda_device, int rank) {
  if (device == ComputeDevice::kCpu) return -1;
  return pick_cuda_device(cuda_device, rank, "--device cuda");
}

std::unique_ptr<ForwardBackend> make_forward_backend(ComputeDevice device, int cuda_device, const ModelShard& shard,
                                                     TensorParallelGroup& group, KvCache& cache, ThreadPool& pool,
                                                     cpu::ActivationPrecision precision, bool cuda_graphs) {
  if (device == ComputeDevice::kCpu) return std::make_unique<ForwardPass>(shard, group, cache, pool, precision);
#ifdef LAZYKV_HAVE_CUDA
  return std::make_unique<CudaForwardPass>(shard, group, cache, pool, cuda_device, precision, cuda_graphs);
#else
  (void)cuda_device;
  (void)cuda_graphs;
  throw Error(ErrorCode::kUnavailable, "--device cuda: this lazykv was built without the CUDA backend");
#endif
}

}  // namespace lazykv
