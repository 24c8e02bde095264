// TierStore costs for 64 KiB blocks: a put (reserve, copy in, checksum-verified
// commit) plus a get of the same block, with the host tier big enough
// (host-only) and too small (every put spills a victim to RocksDB); and a
// promotion: a get of a block that is only in tier 2 (read, verify, copy into
// the pool, erase from tier 2), which also demotes one victim to make room.
// Run with --benchmark_format=json for machine-readable output.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kvstore/tier_store.h"

namespace {

using lazykv::kvstore::BlockHint;
using lazykv::kvstore::BlockKey;
using lazykv::kvstore::TierStore;
using lazykv::kvstore::TierStoreOptions;

constexpr uint64_t kBlockBytes = 64 * 1024;

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tier_store_bench.XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

BlockKey key_of(uint32_t index) { return BlockKey{1, index / 64, 0, index % 64, 0, 256}; }

std::vector<uint8_t> make_payload() {
  std::vector<uint8_t> bytes(kBlockBytes);
  uint64_t state = 1;
  for (uint8_t& b : bytes) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(state >> 56);
  }
  return bytes;
}

TierStoreOptions options(uint64_t host_blocks, const std::string& nvme_path) {
  TierStoreOptions o;
  o.host_capacity_bytes = host_blocks * kBlockBytes;
  o.host_alloc_unit = kBlockBytes;
  o.replacement = "lru";  // a cyclic scan: every promotion is a tier-2 read
  o.nvme_path = nvme_path;
  o.nvme_capacity_bytes = 1ull << 30;
  return o;
}

void put(TierStore& store, const BlockKey& key, const std::vector<uint8_t>& bytes, uint64_t checksum) {
  auto reservation = store.reserve_put(1, key, bytes.size(), BlockHint{8});
  std::memcpy(reservation.buffer().data(), bytes.data(), bytes.size());
  store.commit_put(std::move(reservation), checksum);
}

// keys: distinct blocks cycled over; host_blocks < keys makes every put spill.
void run_put_get(benchmark::State& state, uint64_t host_blocks, uint32_t keys, bool nvme) {
  TempDir dir;
  TierStore store(options(host_blocks, nvme ? (dir.path / "nvme").string() : ""));
  const auto bytes = make_payload();
  const uint64_t checksum = lazykv::kvstore::block_checksum(bytes);
  for (uint32_t i = 0; i < keys; ++i) put(store, key_of(i), bytes, checksum);
  const uint64_t admitted_before = store.stats().nvme_admitted;
  uint32_t next = 0;
  for (auto _ : state) {
    const BlockKey key = key_of(next);
    next = (next + 1) % keys;
    put(store, key, bytes, checksum);
    auto lease = store.get(2, key, BlockHint{8});
    benchmark::DoNotOptimize(lease.bytes().data());
  }
  const auto stats = store.stats();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * kBlockBytes));
  state.counters["nvme_admitted_per_iter"] =
      benchmark::Counter(static_cast<double>(stats.nvme_admitted - admitted_before), benchmark::Counter::kAvgIterations);
}

void BM_PutGetHostOnly(benchmark::State& state) { run_put_get(state, 1024, 512, false); }
void BM_PutGetSpillToNvme(benchmark::State& state) { run_put_get(state, 64, 2048, true); }

void BM_PromoteFromNvme(benchmark::State& state) {
  TempDir dir;
  constexpr uint32_t kKeys = 1024;
  TierStore store(options(64, (dir.path / "nvme").string()));
  const auto bytes = make_payload();
  const uint64_t checksum = lazykv::kvstore::block_checksum(bytes);
  for (uint32_t i = 0; i < kKeys; ++i) put(store, key_of(i), bytes, checksum);
  uint32_t next = 0;
  for (auto _ : state) {
    auto lease = store.get(2, key_of(next), BlockHint{8});
    benchmark::DoNotOptimize(lease.bytes().data());
    next = (next + 1) % kKeys;
  }
  const auto stats = store.stats();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBlockBytes));
  state.counters["nvme_hit_ratio"] =
      static_cast<double>(stats.nvme_hits) / static_cast<double>(std::max<uint64_t>(stats.gets, 1));
}

BENCHMARK(BM_PutGetHostOnly)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PutGetSpillToNvme)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PromoteFromNvme)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
