// Host pool (tier 1) allocator: the cost of one allocate + free on a pool
// already holding a random mix of blocks, and the fragmentation a random
// workload leaves (reported as a counter).
// Run with --benchmark_format=json for machine-readable output.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kvstore/host_pool.h"

namespace {

using lazykv::kvstore::HostPool;

constexpr uint64_t kUnit = 64 * 1024;
constexpr uint64_t kCapacity = 1ull << 30;  // 16384 units; the arena is never touched

// Random sizes of 1 to 64 units (64 KiB to 4 MiB, the range of KV blocks).
uint64_t random_block_bytes(std::mt19937_64& rng) { return (1 + rng() % 64) * kUnit; }

// Fills the pool with random blocks and frees a random half, leaving holes.
std::vector<uint64_t> fragment(HostPool& pool, std::mt19937_64& rng) {
  std::vector<uint64_t> live;
  while (auto offset = pool.allocate(random_block_bytes(rng))) live.push_back(*offset);
  std::vector<uint64_t> kept;
  for (uint64_t offset : live) {
    if (rng() % 2 == 0) {
      pool.free(offset);
    } else {
      kept.push_back(offset);
    }
  }
  return kept;
}

void BM_HostPoolAllocateFree(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  HostPool pool(kCapacity, kUnit);
  std::mt19937_64 rng(1);
  const auto live = fragment(pool, rng);
  for (auto _ : state) {
    auto offset = pool.allocate(bytes);
    if (!offset) {
      state.SkipWithError("pool full");
      break;
    }
    pool.free(*offset);
  }
  state.counters["live_blocks"] = static_cast<double>(live.size());
  state.counters["fragmentation"] = pool.stats().fragmentation;
}

// A steady-state workload: allocate random sizes until the pool refuses,
// then free random blocks; the counters report the state it converges to.
void BM_HostPoolRandomWorkload(benchmark::State& state) {
  HostPool pool(kCapacity, kUnit);
  std::mt19937_64 rng(2);
  std::vector<uint64_t> live;
  uint64_t failures = 0;
  for (auto _ : state) {
    if (auto offset = pool.allocate(random_block_bytes(rng))) {
      live.push_back(*offset);
    } else {
      ++failures;
      for (int i = 0; i < 4 && !live.empty(); ++i) {
        const size_t victim = rng() % live.size();
        pool.free(live[victim]);
        live[victim] = live.back();
        live.pop_back();
      }
    }
  }
  const auto stats = pool.stats();
  state.counters["fragmentation"] = stats.fragmentation;
  state.counters["used_fraction"] = static_cast<double>(stats.used_bytes) / static_cast<double>(stats.capacity_bytes);
  state.counters["blocks"] = static_cast<double>(stats.blocks);
  state.counters["failed_allocations"] = static_cast<double>(failures);
}

BENCHMARK(BM_HostPoolAllocateFree)->Arg(64 << 10)->Arg(1 << 20)->Arg(4 << 20);
BENCHMARK(BM_HostPoolRandomWorkload)->Iterations(200000);

}  // namespace

BENCHMARK_MAIN();
