// What the CUDA bandwidth benchmarks share: timing a launch with CUDA events,
// and main's frame (iterations from argv; the device, its copy rate and the
// iterations at the head of the JSON; errors to stderr).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>

#include <nlohmann/json.hpp>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {

class LaunchTimer {
 public:
  LaunchTimer() {
    LAZYKV_CUDA_CHECK(cudaEventCreate(&start_));
    LAZYKV_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~LaunchTimer() {
    static_cast<void>(cudaEventDestroy(start_));
    static_cast<void>(cudaEventDestroy(stop_));
  }
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;

  // Mean seconds of `launch` (on the default stream) over `iterations` runs after a warm-up.
  template <class Launch>
  double seconds_per_call(int iterations, Launch&& launch) {
    for (int w = 0; w < 3; ++w) launch();
    LAZYKV_CUDA_CHECK(cudaEventRecord(start_));
    for (int it = 0; it < iterations; ++it) launch();
    LAZYKV_CUDA_CHECK(cudaEventRecord(stop_));
    LAZYKV_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    LAZYKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms) * 1e-3 / iterations;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// usage: NAME [iterations]. `measure(out, iterations, copy_read_write)` adds
// its results to `out`, which is then printed.
inline int bandwidth_main(const char* name, int argc, char** argv,
                          const std::function<void(nlohmann::json&, int, double)>& measure) {
  try {
    const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
    cudaDeviceProp prop{};
    LAZYKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const double copy = measure_copy_rate();
    nlohmann::json out = {{"device", prop.name},
                          {"copy_gb_s", copy / 1e9},
                          {"copy_read_write_gb_s", 2 * copy / 1e9},
                          {"iterations", iterations}};
    measure(out, iterations, 2 * copy);
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace lazykv::cuda
