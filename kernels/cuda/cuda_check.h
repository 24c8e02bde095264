// Turns CUDA runtime errors into lazykv::Error (kInternal; kOutOfMemory for a
// failed allocation) that name the failing call's file and line, so a bad
// launch or a lost device surfaces as an exception like every other failure
// in the engine.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.h"

namespace lazykv::cuda {

// An allocation that failed is Error(kOutOfMemory), so a caller can give the
// memory back and retry (the worker preempts); the runtime's last-error slot
// is cleared, or the next launch check would report the old failure.
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  static_cast<void>(cudaGetLastError());
  throw Error(status == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
              std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + cudaGetErrorName(status) + " (" +
                  cudaGetErrorString(status) + ")");
}

inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda_error(status, what, file, line);
}

}  // namespace lazykv::cuda

// Evaluates a cudaError_t expression once; throws lazykv::Error on failure.
#define LAZYKV_CUDA_CHECK(expr) ::lazykv::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)

// After a <<<...>>> launch: reports bad launch configurations at once
// (asynchronous faults surface at the next synchronising call).
#define LAZYKV_CUDA_CHECK_LAUNCH() ::lazykv::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
