// Tier-2 (RocksDB) write and read throughput by block size, in a temporary
// database under /tmp (so the numbers describe that filesystem, not an NVMe
// drive unless /tmp is on one). Writes cycle over a fixed set of keys, so
// later writes replace earlier ones and the database stays bounded.
// Run with --benchmark_format=json for machine-readable output.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvstore/nvme_tier.h"

namespace {

namespace fs = std::filesystem;
using lazykv::kvstore::BlockKey;
using lazykv::kvstore::NvmeTier;
using lazykv::kvstore::NvmeTierOptions;

constexpr uint64_t kWorkingSetBytes = 128ull << 20;  // keys cycled over, per block size

// A fresh database directory, removed when the benchmark ends.
class TempDatabase {
 public:
  TempDatabase() {
    std::string pattern = (fs::temp_directory_path() / "lazykv_nvme_bench_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
  }
  ~TempDatabase() { fs::remove_all(dir_); }
  std::string path() const { return (dir_ / "db").string(); }

 private:
  fs::path dir_;
};

BlockKey key_of(uint64_t index, uint32_t block_tokens) {
  return BlockKey{.model_fingerprint = 1,
                  .sequence = index / 64,
                  .layer = static_cast<uint32_t>(index % 64),
                  .kv_head = 0,
                  .first_position = 0,
                  .count = block_tokens};
}

std::vector<uint8_t> payload(size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  return data;
}

void BM_NvmeTierPut(benchmark::State& state) {
  const size_t block_bytes = static_cast<size_t>(state.range(0));
  const uint64_t keys = kWorkingSetBytes / block_bytes;
  TempDatabase db;
  NvmeTier tier(NvmeTierOptions{.path = db.path(), .capacity_bytes = 2 * kWorkingSetBytes});
  const auto data = payload(block_bytes);
  const uint64_t checksum = lazykv::kvstore::block_checksum(data);
  uint64_t next = 0;
  for (auto _ : state) {
    tier.put(key_of(next % keys, 16), data, checksum);
    ++next;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * block_bytes));
}

void BM_NvmeTierGet(benchmark::State& state) {
  const size_t block_bytes = static_cast<size_t>(state.range(0));
  const uint64_t keys = kWorkingSetBytes / block_bytes;
  TempDatabase db;
  NvmeTier tier(NvmeTierOptions{.path = db.path(), .capacity_bytes = 2 * kWorkingSetBytes});
  const auto data = payload(block_bytes);
  const uint64_t checksum = lazykv::kvstore::block_checksum(data);
  for (uint64_t i = 0; i < keys; ++i) tier.put(key_of(i, 16), data, checksum);
  std::vector<uint8_t> out;
  uint64_t next = 0;
  for (auto _ : state) {
    if (!tier.get(key_of(next % keys, 16), out)) state.SkipWithError("block missing");
    benchmark::DoNotOptimize(out.data());
    ++next;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * block_bytes));
}

BENCHMARK(BM_NvmeTierPut)->Arg(64 << 10)->Arg(256 << 10)->Arg(1 << 20)->Arg(4 << 20)->UseRealTime();
BENCHMARK(BM_NvmeTierGet)->Arg(64 << 10)->Arg(256 << 10)->Arg(1 << 20)->Arg(4 << 20)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
