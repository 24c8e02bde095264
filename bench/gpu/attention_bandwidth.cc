// Decode attention (cuda::attention_units) against the GPU's own copy rate:
// the Llama-3-8B layer shape (8 KV heads, 4 queries each, head_dim 128, pages
// of 64 slots) for 1 and 8 sequences at contexts 128 to 32768, the K/V bytes
// read per second and their fraction of a device-to-device copy (read +
// write). Prints one JSON object.
//   usage: cuda_attention_bandwidth [iterations]
#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/gpu/bandwidth_bench.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace lazykv::cuda {
namespace {

constexpr int kHeadsKv = 8, kGroup = 4, kHeadDim = 128, kPageSlots = 64;

// One layer's attention for `sequences` sequences of `context` slots each.
nlohmann::json measure(int sequences, int32_t context, int iterations, double copy_rw) {
  const int64_t n_units = int64_t(sequences) * kHeadsKv;
  const int64_t pages_per_unit = (context + kPageSlots - 1) / kPageSlots;
  const size_t page_halves = size_t(kPageSlots) * kHeadDim;
  DeviceBuffer<uint16_t> keys(size_t(n_units * pages_per_unit) * page_halves);
  DeviceBuffer<uint16_t> values(keys.size());
  // 0x3c00: f16 1.0 everywhere: finite scores; the values do not change the time.
  std::vector<uint16_t> ones(keys.size(), 0x3c00);
  keys.upload(ones.data(), ones.size());
  values.upload(ones.data(), ones.size());
  DeviceBuffer<float> q(size_t(n_units) * kGroup * kHeadDim), out(q.size());
  LAZYKV_CUDA_CHECK(cudaMemset(q.data(), 0, q.bytes()));
  std::vector<const uint16_t*> tables;  // per unit: its key pages, then its value pages
  for (int64_t u = 0; u < n_units; ++u) {
    for (const DeviceBuffer<uint16_t>* kind : {&keys, &values}) {
      for (int64_t p = 0; p < pages_per_unit; ++p) tables.push_back(kind->data() + (u * pages_per_unit + p) * page_halves);
    }
  }
  DeviceBuffer<const uint16_t*> d_tables(tables);
  std::vector<AttentionUnit> units;
  for (int64_t u = 0; u < n_units; ++u) {
    const uint16_t* const* table = d_tables.data() + u * 2 * pages_per_unit;
    units.push_back({q.data() + u * kGroup * kHeadDim, out.data() + u * kGroup * kHeadDim, nullptr, table,
                     table + pages_per_unit, context, kGroup});
  }
  DeviceBuffer<AttentionUnit> d_units(units);
  DeviceBuffer<float> scratch(attention_scratch_floats(n_units, kGroup, kHeadDim, context));
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  const double seconds = LaunchTimer().seconds_per_call(iterations, [&] {
    attention_units(d_units.data(), n_units, kGroup, kHeadDim, kPageSlots, scale, context, scratch.data(), nullptr);
  });
  const double kv_bytes = double(n_units) * double(context) * kHeadDim * 2 * sizeof(uint16_t);
  return {{"sequences", sequences},
          {"context", context},
          {"us", seconds * 1e6},
          {"kv_read_gb_s", kv_bytes / seconds / 1e9},
          {"fraction_of_copy", kv_bytes / seconds / copy_rw}};
}

}  // namespace
}  // namespace lazykv::cuda

int main(int argc, char** argv) {
  using namespace lazykv;
  const auto measure_all = [](nlohmann::json& out, int iterations, double copy_rw) {
    out["shape"] = "llama3-8b layer: 8 kv heads x 4 queries, head_dim 128, 64-slot pages";
    for (int sequences : {1, 8}) {
      for (int32_t context : {128, 2048, 8192, 32768}) {
        out["attention"].push_back(cuda::measure(sequences, context, iterations, copy_rw));
      }
    }
  };
  return cuda::bandwidth_main("cuda_attention_bandwidth", argc, argv, measure_all);
}
