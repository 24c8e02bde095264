#include "cli/bench_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/huge_memory.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kBufferBytes = size_t(1) << 30;  // past any last-level cache seen (300 MB on CI's Xeon)
constexpr int kPasses = 3;

// On huge pages, as the CPU's weights are (common/mapped_file.h): the
// memory's rate, not the page walks' (on a Xeon guest 28 GB/s against 20 on
// 4 KiB pages, two threads).
HugeMemory make_buffer(ThreadPool& pool) {
  HugeMemory buffer(kBufferBytes);
  // Touched by the threads that will read it, so the pages are resident (and local) before timing.
  pool.run([&](int thread, int n) {
    const size_t begin = kBufferBytes * size_t(thread) / size_t(n), end = kBufferBytes * size_t(thread + 1) / size_t(n);
    std::memset(buffer.data() + begin, 1, end - begin);
  });
  return buffer;
}

// Best bytes per second of pass(thread, begin, end) over the buffer split
// across the pool's threads.
template <typename Pass>
double best_rate(ThreadPool& pool, Pass pass) {
  double best = 0;
  for (int p = 0; p < kPasses; ++p) {
    const auto start = Clock::now();
    pool.run([&](int thread, int n) {
      pass(thread, kBufferBytes * size_t(thread) / size_t(n), kBufferBytes * size_t(thread + 1) / size_t(n));
    });
    best = std::max(best, double(kBufferBytes) / std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

}  // namespace

MemoryBandwidth measure_memory_bandwidth(ThreadPool& pool) {
  const HugeMemory source = make_buffer(pool);
  MemoryBandwidth out;
  std::vector<uint64_t> sums(size_t(pool.size()) * 8);  // a cache line per thread
  out.read_bytes_per_s = best_rate(pool, [&](int thread, size_t begin, size_t end) {
    const auto* words = reinterpret_cast<const uint64_t*>(source.data() + begin);
    uint64_t a = 0, b = 0, c = 0, d = 0;  // four chains: the adds keep up with memory
    for (size_t i = 0; i + 4 <= (end - begin) / 8; i += 4) {
      a += words[i];
      b += words[i + 1];
      c += words[i + 2];
      d += words[i + 3];
    }
    sums[size_t(thread) * 8] = a + b + c + d;  // kept, so the reads stay
  });
  const HugeMemory target = make_buffer(pool);
  out.copy_bytes_per_s = best_rate(pool, [&](int, size_t begin, size_t end) {
    std::memcpy(target.data() + begin, source.data() + begin, end - begin);
  });
  return out;
}

nlohmann::json weight_read_report(double weight_bytes, double limit_bytes_per_s, const std::string& limit,
                                  const nlohmann::json& figures) {
  nlohmann::json out;
  for (const auto& [name, value] : figures.items()) {
    // decode_ctx{C}_tok_s: one sequence; decode_batch{B}_ctx{C}_tok_s: B, a token each per step.
    const std::string prefix = "decode_", suffix = "_tok_s";
    if (name.rfind(prefix, 0) != 0 || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0 || !value.is_number()) {
      continue;
    }
    double batch = 1;
    if (name.rfind("decode_batch", 0) == 0) batch = std::stod(name.substr(std::string("decode_batch").size()));
    const double weight_read = weight_bytes * value.get<double>() / batch;
    const std::string figure = name.substr(0, name.size() - suffix.size());
    out[figure + "_weight_read_gb_s"] = weight_read / 1e9;
    out[figure + "_fraction_of_" + limit] = weight_read / limit_bytes_per_s;
  }
  return out;
}

nlohmann::json bandwidth_report(const Model& model, const MemoryBandwidth& memory, const nlohmann::json& figures) {
  const double weights = double(model.decode_weight_bytes());
  nlohmann::json out = {{"read_gb_s", memory.read_bytes_per_s / 1e9},
                        {"copy_gb_s", memory.copy_bytes_per_s / 1e9},
                        {"decode_weight_bytes", weights}};
  out.update(weight_read_report(weights, memory.read_bytes_per_s, "read", figures));
  return out;
}

}  // namespace lazykv
