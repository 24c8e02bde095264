// matmul throughput on the default model's shapes (SmolLM2-135M: hidden 576,
// MLP 1536, vocabulary 49152), other weight types, and the optional 1.5B
// model's MLP. bytes_per_second counts the weight bytes read
// per call, to compare with memory bandwidth (decode is memory-bound);
// the 1.5B shapes also run as a model does, cycling through enough copies
// of the matrix (copies > 1) that its rows come from memory, not the cache;
// FLOP/s counts 2·rows·cols·batch per call (prefill is compute-bound).
//   matmul_bench --benchmark_format=json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/huge_memory.h"
#include "common/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/quant.h"

namespace lazykv::cpu {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> random_weights(DType type, int64_t rows, int64_t cols) {
  const size_t row = row_bytes(type, static_cast<size_t>(cols));
  std::vector<uint8_t> data(row * static_cast<size_t>(rows));
  const auto src = random_floats(static_cast<size_t>(cols) * 64, 1);  // 64 distinct rows, repeated
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, src.data() + (r % 64) * cols, data.data() + r * row, cols);
  }
  return data;
}

ThreadPool& pool(int threads) {
  static ThreadPool one(1), two(2);
  return threads == 1 ? one : two;
}

// Args: weight type id, rows, cols, batch, threads, precision (0 f32, 1 int8),
// copies of the matrix cycled through.
void BM_Matmul(benchmark::State& state) {
  const auto type = static_cast<DType>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), batch = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const auto precision = state.range(5) == 0 ? ActivationPrecision::kF32 : ActivationPrecision::kInt8;
  const int64_t copies = state.range(6);
  const auto matrix = random_weights(type, rows, cols);
  // On huge pages, as a model's weights on the CPU (common/mapped_file.h).
  HugeMemory weights(matrix.size() * static_cast<size_t>(copies));
  for (int64_t c = 0; c < copies; ++c) std::copy(matrix.begin(), matrix.end(), weights.data() + c * matrix.size());
  WeightMatrix w{type, rows, cols, weights.data()};
  const auto x = random_floats(static_cast<size_t>(batch * cols), 2);
  std::vector<float> y(static_cast<size_t>(batch * rows));
  const size_t scratch_bytes = matmul_scratch_bytes(w, batch, threads, precision);
  std::unique_ptr<uint8_t, void (*)(uint8_t*)> scratch(
      static_cast<uint8_t*>(::operator new(scratch_bytes + 64, std::align_val_t(64))),
      [](uint8_t* p) { ::operator delete(p, std::align_val_t(64)); });
  ThreadPool& p = pool(threads);

  int64_t call = 0;
  for (auto _ : state) {
    w.data = weights.data() + (call++ % copies) * matrix.size();
    matmul(w, x.data(), batch, y.data(), scratch.get(), p, precision);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(matrix.size()));
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(rows * cols * batch),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(dtype_traits(type).name) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                 " batch " + std::to_string(batch) + " threads " + std::to_string(threads) +
                 (precision == ActivationPrecision::kF32 ? " f32-act" : " int8-act") +
                 (copies > 1 ? " from memory" : ""));
}

constexpr int64_t id(DType t) { return static_cast<int64_t>(t); }

void DefaultModelShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "batch", "threads", "int8", "copies"});
  for (int64_t precision : {0, 1}) {
    for (int64_t threads : {1, 2}) {
      for (int64_t batch : {1, 8, 512}) {
        b->Args({id(DType::kQ4_1), 1536, 576, batch, threads, precision, 1});   // MLP gate/up
        b->Args({id(DType::kQ4_1), 576, 1536, batch, threads, precision, 1});   // MLP down
        b->Args({id(DType::kQ4_1), 576, 576, batch, threads, precision, 1});    // attention q/o
      }
      b->Args({id(DType::kQ8_0), 49152, 576, 1, threads, precision, 1});        // tied output projection
      b->Args({id(DType::kQ8_0), 49152, 576, 8, threads, precision, 1});
      b->Args({id(DType::kQ8_0), 8192, 576, 512, threads, precision, 1});  // a slice: the full matrix x 512 is slow
    }
  }
}

void OtherTypes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "batch", "threads", "int8", "copies"});
  for (int64_t precision : {0, 1}) {
    for (DType t : {DType::kQ4_0, DType::kQ4_K, DType::kQ6_K, DType::kF16, DType::kBF16, DType::kF32}) {
      for (int64_t batch : {1, 8, 64}) b->Args({id(t), 1536, 768, batch, 2, precision, 1});
    }
  }
}

// Qwen2.5-1.5B (the optional model, Q4_K_M): hidden 1536, MLP 8960,
// vocabulary 151936. Each MLP shape also from memory: 64 copies (about
// 0.5 GB of Q4_K, 0.7 GB of Q6_K) exceed the CI machine's last-level cache,
// as a model's layers do.
void LargerModelShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "batch", "threads", "int8", "copies"});
  for (int64_t copies : {1, 64}) {
    for (int64_t precision : {0, 1}) {
      for (int64_t batch : {1, 2, 4, 8}) {
        b->Args({id(DType::kQ4_K), 8960, 1536, batch, 2, precision, copies});  // MLP gate/up
        b->Args({id(DType::kQ6_K), 1536, 8960, batch, 2, precision, copies});  // MLP down
      }
    }
  }
  // The output projection, a fifth of the bytes a decode step reads: 191 MB, from memory as it is.
  for (int64_t precision : {0, 1}) {
    for (int64_t batch : {1, 8}) b->Args({id(DType::kQ6_K), 151936, 1536, batch, 2, precision, 1});
  }
}

// Prefill shapes of both models with the AMX tiles (matmul_amx.h) on and
// off, where the CPU has them: the eighth argument.
void BM_MatmulPrefill(benchmark::State& state) {
  set_amx_enabled(state.range(7) != 0);
  if (state.range(7) != 0 && !amx_bf16_usable()) {
    state.SkipWithError("no AMX-BF16 tiles here");
    return;
  }
  BM_Matmul(state);
  set_amx_enabled(true);
}

void PrefillShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "batch", "threads", "int8", "copies", "amx"});
  for (int64_t amx : {0, 1}) {
    for (int64_t batch : {32, 64, 512}) {
      b->Args({id(DType::kQ4_1), 1536, 576, batch, 2, 0, 1, amx});   // SmolLM2 MLP gate/up
      b->Args({id(DType::kQ4_1), 576, 1536, batch, 2, 0, 1, amx});   // MLP down
      b->Args({id(DType::kQ4_K), 8960, 1536, batch, 2, 0, 1, amx});  // Qwen2.5-1.5B MLP gate/up
      b->Args({id(DType::kQ6_K), 1536, 8960, batch, 2, 0, 1, amx});  // MLP down
      b->Args({id(DType::kQ4_K), 256, 1536, batch, 2, 0, 1, amx});   // K/V projection
    }
  }
}

BENCHMARK(BM_Matmul)->Apply(DefaultModelShapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Matmul)->Name("BM_MatmulOtherTypes")->Apply(OtherTypes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Matmul)->Name("BM_MatmulLargerModel")->Apply(LargerModelShapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulPrefill)->Apply(PrefillShapes)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace lazykv::cpu

BENCHMARK_MAIN();
