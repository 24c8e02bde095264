// The CUDA decode matmul against the GPU's own copy rate: for each weight
// type matmul reads, the Llama-3-8B layer shapes at 1, 2, 4 and 8 activation
// rows, the weight bytes read per second and their fraction of a
// device-to-device copy (read + write). Prints one JSON object.
//   usage: cuda_matmul_bandwidth [iterations]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {
namespace {

struct Shape {
  const char* name;
  int64_t rows, cols;
};

// One Llama-3-8B layer: q, k, v, o, gate, up, down.
constexpr Shape kLayer[] = {{"q", 4096, 4096},     {"k", 1024, 4096},    {"v", 1024, 4096},   {"o", 4096, 4096},
                            {"gate", 14336, 4096}, {"up", 14336, 4096}, {"down", 4096, 14336}};

// Seconds per matmul of each shape, averaged over `iterations` after a warm-up.
nlohmann::json measure_type(DType type, int batch, int iterations, double copy_rw) {
  std::vector<DeviceBuffer<uint8_t>> weights;
  std::vector<WeightMatrix> matrices;
  size_t layer_bytes = 0;
  for (const Shape& s : kLayer) {
    const size_t bytes = tiled_bytes(type, s.rows, s.cols);
    // 0x11 bytes: finite scales and weights; the values do not change the time.
    LAZYKV_CUDA_CHECK(cudaMemset(weights.emplace_back(bytes).data(), 0x11, bytes));
    matrices.push_back({type, s.rows, s.cols, weights.back().data()});
    layer_bytes += bytes;
  }
  DeviceBuffer<float> x(size_t(batch) * 14336), y(size_t(batch) * 14336);
  LAZYKV_CUDA_CHECK(cudaMemset(x.data(), 0, x.bytes()));
  cudaEvent_t start = nullptr, stop = nullptr;
  LAZYKV_CUDA_CHECK(cudaEventCreate(&start));
  LAZYKV_CUDA_CHECK(cudaEventCreate(&stop));
  nlohmann::json out = {{"type", dtype_traits(type).name}, {"batch", batch}};
  double layer_s = 0;
  for (size_t i = 0; i < matrices.size(); ++i) {
    for (int w = 0; w < 3; ++w) matmul(matrices[i], x.data(), batch, y.data(), nullptr);
    LAZYKV_CUDA_CHECK(cudaEventRecord(start));
    for (int it = 0; it < iterations; ++it) matmul(matrices[i], x.data(), batch, y.data(), nullptr);
    LAZYKV_CUDA_CHECK(cudaEventRecord(stop));
    LAZYKV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    LAZYKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    const double seconds = double(ms) * 1e-3 / iterations;
    layer_s += seconds;
    const double rate = double(weights[i].bytes()) / seconds;
    out[kLayer[i].name] = {{"us", seconds * 1e6}, {"weight_read_gb_s", rate / 1e9}, {"fraction_of_copy", rate / copy_rw}};
  }
  const double rate = double(layer_bytes) / layer_s;
  out["layer_us"] = layer_s * 1e6;
  out["layer_weight_read_gb_s"] = rate / 1e9;
  out["layer_fraction_of_copy"] = rate / copy_rw;
  static_cast<void>(cudaEventDestroy(start));
  static_cast<void>(cudaEventDestroy(stop));
  return out;
}

}  // namespace
}  // namespace lazykv::cuda

int main(int argc, char** argv) {
  using namespace lazykv;
  try {
    const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
    cudaDeviceProp prop{};
    LAZYKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const double copy = cuda::measure_copy_rate();
    nlohmann::json out = {{"device", prop.name},
                          {"copy_gb_s", copy / 1e9},
                          {"copy_read_write_gb_s", 2 * copy / 1e9},
                          {"iterations", iterations}};
    for (DType type : {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0, DType::kF16, DType::kBF16}) {
      for (int batch : {1, 2, 4, 8}) out["matmul"].push_back(cuda::measure_type(type, batch, iterations, 2 * copy));
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_matmul_bandwidth: %s\n", e.what());
    return 1;
  }
}
