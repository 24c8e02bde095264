// The kvstore end to end on loopback, as a worker sees it: KvstoreClient ->
// UCX (tcp) -> KvstoreService -> TierStore. Demotion (put into the host
// tier), a get served from the host tier, a row get (the rows of a block
// that lazy+tiers fetches), and promotion latency: a get of a
// block that was spilled to the NVMe tier (RocksDB under /tmp), which reads
// it back, verifies it and moves it to the host tier before sending it.
// Counters p50_us/p99_us are per-call latency percentiles.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/rpc/grpc_server.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/service/kvstore_service.h"

namespace {

using namespace lazykv;
using namespace lazykv::kvstore;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxBlock = 4 << 20;

// A kvstore with a 64 MiB host tier over a RocksDB tier, and a client.
struct Node {
  std::string dir = (std::filesystem::temp_directory_path() / ("lazykv-kvstore-bench-" + std::to_string(getpid())))
                        .string();
  std::unique_ptr<KvstoreService> service;
  std::unique_ptr<GrpcServer> control;
  std::unique_ptr<KvstoreClient> client;
  std::vector<uint8_t> staging = std::vector<uint8_t>(2 * kMaxBlock, 0x3c);
  uint64_t next_sequence = 1;

  Node() {
    std::filesystem::remove_all(dir);
    KvstoreServiceOptions options;
    options.tiers.host_capacity_bytes = 64 << 20;
    options.tiers.nvme_path = dir;
    options.tiers.nvme_capacity_bytes = 4ull << 30;
    options.transport.transports = "tcp";
    service = std::make_unique<KvstoreService>(options, nullptr);
    control = std::make_unique<GrpcServer>("127.0.0.1", 0, *service, KvstoreService::kServiceName);
    KvstoreClientOptions client_options;
    client_options.address = "127.0.0.1:" + std::to_string(control->port());
    client_options.transport.transports = "tcp";
    client_options.timeout = std::chrono::seconds(30);
    client = std::make_unique<KvstoreClient>(client_options);
    client->register_memory(staging);
  }
  ~Node() {
    client.reset();
    control.reset();
    service.reset();
    std::filesystem::remove_all(dir);
  }
  BlockKey key(uint64_t sequence, uint32_t layer, size_t bytes) const {
    return BlockKey{42, sequence, layer, 0, 0, uint32_t(bytes / 256)};
  }
};

Node& node() {
  static Node* n = new Node();  // lives to the end of the process
  return *n;
}

void report(benchmark::State& state, std::vector<double>& micros, size_t bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  if (micros.empty()) return;
  std::sort(micros.begin(), micros.end());
  state.counters["p50_us"] = micros[micros.size() / 2];
  state.counters["p99_us"] = micros[std::min(micros.size() - 1, micros.size() * 99 / 100)];
}

void BM_DemoteToHost(benchmark::State& state) {
  Node& n = node();
  const auto bytes = size_t(state.range(0));
  const uint64_t sequence = n.next_sequence++;
  const auto payload = std::span<const uint8_t>(n.staging).first(bytes);
  std::vector<double> micros;
  uint32_t layer = 0;
  for (auto _ : state) {
    // Keep well inside the host tier: a sequence's blocks are dropped as it would end.
    if ((uint64_t(layer) + 1) * bytes > (32u << 20)) {
      state.PauseTiming();
      n.client->drop_sequence(42, sequence);
      layer = 0;
      state.ResumeTiming();
    }
    const auto start = Clock::now();
    n.client->put(n.key(sequence, layer++, bytes), payload, BlockHint{0});
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  n.client->drop_sequence(42, sequence);
  report(state, micros, bytes);
}

void BM_GetFromHost(benchmark::State& state) {
  Node& n = node();
  const auto bytes = size_t(state.range(0));
  const uint64_t sequence = n.next_sequence++;
  const BlockKey key = n.key(sequence, 0, bytes);
  n.client->put(key, std::span<const uint8_t>(n.staging).first(bytes), BlockHint{0});
  const auto out = std::span<uint8_t>(n.staging).subspan(kMaxBlock, bytes);
  std::vector<double> micros;
  for (auto _ : state) {
    const auto start = Clock::now();
    benchmark::DoNotOptimize(n.client->get(key, out, BlockHint{0}));
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  n.client->drop_sequence(42, sequence);
  report(state, micros, bytes);
  state.SetLabel("host tier hit");
}

// A row get, as lazy+tiers fetches: `rows` rows (spread over the block) of a
// 64 KiB block of 256 K rows then 256 V rows of 128 bytes (head_dim 64,
// f16). Against BM_GetFromHost/65536, the whole block.
void BM_GetRowsFromHost(benchmark::State& state) {
  Node& n = node();
  constexpr uint32_t kRows = 256, kRowBytes = 128;
  const uint64_t sequence = n.next_sequence++;
  const BlockKey key{42, sequence, 0, 0, 0, kRows};
  n.client->put(key, std::span<const uint8_t>(n.staging).first(2 * kRows * kRowBytes), BlockHint{0});
  RowSelection selection{{}, kRowBytes};
  const auto rows = uint32_t(state.range(0));
  for (uint32_t i = 0; i < rows; ++i) selection.rows.push_back(i * (kRows / rows));
  const auto out = std::span<uint8_t>(n.staging).subspan(kMaxBlock, selection.bytes());
  std::vector<double> micros;
  for (auto _ : state) {
    const auto start = Clock::now();
    benchmark::DoNotOptimize(n.client->get_rows(key, selection, out, BlockHint{0}));
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  n.client->drop_sequence(42, sequence);
  report(state, micros, selection.bytes());
  state.SetLabel("rows of a 64 KiB block, host tier hit");
}

// Promotion latency: every get finds its block only in the NVMe tier.
void BM_PromoteFromNvme(benchmark::State& state) {
  Node& n = node();
  const auto bytes = size_t(state.range(0));
  const auto payload = std::span<const uint8_t>(n.staging).first(bytes);
  const auto out = std::span<uint8_t>(n.staging).subspan(kMaxBlock, bytes);
  // 96 MiB of blocks through a 64 MiB host tier; the older a block, the later
  // its predicted reuse (still within the admission horizon), so the oldest
  // spill to the nvme tier first.
  const size_t blocks = (96u << 20) / bytes;
  std::vector<double> micros;
  for (auto _ : state) {
    state.PauseTiming();
    const uint64_t sequence = n.next_sequence++;
    for (size_t b = 0; b < blocks; ++b) {
      n.client->put(n.key(sequence, uint32_t(b), bytes), payload, BlockHint{uint64_t(100 + blocks - b)});
    }
    const TierStoreStats before = n.client->stats();
    state.ResumeTiming();
    const auto start = Clock::now();
    benchmark::DoNotOptimize(n.client->get(n.key(sequence, 0, bytes), out, BlockHint{0}));  // the oldest: in nvme
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    state.PauseTiming();
    const bool from_nvme = n.client->stats().nvme_hits == before.nvme_hits + 1;
    n.client->drop_sequence(42, sequence);
    if (!from_nvme) {
      state.SkipWithError("the block was not in the nvme tier");
      break;
    }
    state.ResumeTiming();
  }
  report(state, micros, bytes);
  state.SetLabel("nvme -> host -> worker");
}

BENCHMARK(BM_DemoteToHost)->RangeMultiplier(4)->Range(4 << 10, 4 << 20)->UseRealTime();
BENCHMARK(BM_GetFromHost)->RangeMultiplier(4)->Range(4 << 10, 4 << 20)->UseRealTime();
BENCHMARK(BM_GetRowsFromHost)->RangeMultiplier(4)->Range(1, 256)->UseRealTime();
BENCHMARK(BM_PromoteFromNvme)->Arg(64 << 10)->Arg(256 << 10)->Arg(1 << 20)->Arg(4 << 20)->Iterations(8)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
