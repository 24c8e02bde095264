// The CUDA decode matmul against the GPU's own copy rate: for each weight
// type matmul reads, the Llama-3-8B layer shapes at 1, 2, 4 and 8 activation
// rows, the weight bytes read per second and their fraction of a
// device-to-device copy (read + write), with f32 activations and, for Q4_0,
// Q4_1 and Q8_0, int8 (the quantization of the inputs counted in the
// layer's time). Prints one JSON object.
//   usage: cuda_matmul_bandwidth [iterations]
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/gpu/bandwidth_bench.h"
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

// Seconds per matmul of each shape, f32 activations or int8 (matmul_q8, the
// quantization of its input timed apart: once per input, shared by Q, K, V
// and by gate, up).
nlohmann::json measure_type(DType type, int batch, bool int8, int iterations, double copy_rw) {
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
  DeviceBuffer<int8_t> xq(size_t(batch) * 14336);
  DeviceBuffer<float> xd(size_t(batch) * 14336 / 32), xs(size_t(batch) * 14336 / 32);
  const Q8Activations q8{xq.data(), xd.data(), xs.data()};
  LaunchTimer timer;
  nlohmann::json out = {{"type", dtype_traits(type).name}, {"batch", batch}, {"activations", int8 ? "int8" : "f32"}};
  double layer_s = 0;
  for (size_t i = 0; i < matrices.size(); ++i) {
    float* out_y = y.data();
    const double seconds = timer.seconds_per_call(iterations, [&] {
      if (int8) return matmul_q8_shared_input(&matrices[i], &out_y, 1, q8, batch, nullptr);
      matmul(matrices[i], x.data(), batch, y.data(), nullptr);
    });
    layer_s += seconds;
    const double rate = double(weights[i].bytes()) / seconds;
    out[kLayer[i].name] = {{"us", seconds * 1e6}, {"weight_read_gb_s", rate / 1e9}, {"fraction_of_copy", rate / copy_rw}};
  }
  if (int8) {  // four inputs a layer: x (for Q, K, V), attention (O), x (gate, up), SiLU (down)
    const double narrow = timer.seconds_per_call(iterations, [&] { quantize_q8(x.data(), batch, 4096, q8, nullptr); });
    const double wide = timer.seconds_per_call(iterations, [&] { quantize_q8(x.data(), batch, 14336, q8, nullptr); });
    out["quantize_us"] = {{"cols_4096", narrow * 1e6}, {"cols_14336", wide * 1e6}};
    layer_s += 3 * narrow + wide;
  }
  const double rate = double(layer_bytes) / layer_s;
  out["layer_us"] = layer_s * 1e6;
  out["layer_weight_read_gb_s"] = rate / 1e9;
  out["layer_fraction_of_copy"] = rate / copy_rw;
  return out;
}

}  // namespace
}  // namespace lazykv::cuda

int main(int argc, char** argv) {
  using namespace lazykv;
  return cuda::bandwidth_main("cuda_matmul_bandwidth", argc, argv, [](nlohmann::json& out, int iterations, double copy_rw) {
    for (DType type : {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0, DType::kF16, DType::kBF16}) {
      for (int batch : {1, 2, 4, 8}) {
        out["matmul"].push_back(cuda::measure_type(type, batch, false, iterations, copy_rw));
        if (cuda::matmul_q8_supported(type)) {
          out["matmul"].push_back(cuda::measure_type(type, batch, true, iterations, copy_rw));
        }
      }
    }
  });
}
