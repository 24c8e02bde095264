// Throughput and latency of the kvstore's UCX messenger on loopback: put-like
// calls (a block travels client -> server) and get-like calls (server ->
// client), over tcp and over shm (+tcp for the connection manager; UCX then
// carries messages on sysv/posix and blocks by cma), with a memcpy of the
// same sizes as the reference. Each run's label is the transport the client
// reported. Counters p50_us/p99_us are the per-call latency percentiles.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/transport/messenger.h"

namespace {

using namespace lazykv::transport;

constexpr uint32_t kOpPut = 1;
constexpr uint32_t kOpGet = 2;
constexpr size_t kMaxBlock = 4 << 20;

// One server and one client per transport, kept for the whole run.
struct Loopback {
  std::vector<uint8_t> server_arena = std::vector<uint8_t>(kMaxBlock, 0x5a);
  std::vector<uint8_t> client_arena = std::vector<uint8_t>(2 * kMaxBlock, 0xa5);
  std::unique_ptr<Server> server;
  std::unique_ptr<Client> client;

  explicit Loopback(const std::string& transports) {
    TransportOptions options;
    options.transports = transports;
    ServerHandlers handlers;
    handlers.payload_sink = [this](PeerId, uint32_t, std::span<const uint8_t>, size_t bytes) {
      return PayloadSink{std::span<uint8_t>(server_arena).first(bytes), nullptr};
    };
    handlers.on_request = [this](ServerRequest&& request, Responder responder) {
      if (request.op == kOpGet) {
        uint64_t bytes = 0;
        std::memcpy(&bytes, request.header.data(), sizeof(bytes));
        responder.reply(kStatusOk, {}, std::span<const uint8_t>(server_arena).first(bytes));
      } else {
        responder.reply(kStatusOk, {});
      }
    };
    server = std::make_unique<Server>(options, "127.0.0.1", 0, std::move(handlers));
    server->register_memory(server_arena);
    client = std::make_unique<Client>(options, "127.0.0.1", server->port());
    client->register_memory(client_arena);
  }
};

Loopback& loopback(const std::string& transports) {
  static std::map<std::string, std::unique_ptr<Loopback>> pairs;
  auto& pair = pairs[transports];
  if (!pair) pair = std::make_unique<Loopback>(transports);
  return *pair;
}

void report(benchmark::State& state, std::vector<double>& micros, size_t bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  if (micros.empty()) return;
  std::sort(micros.begin(), micros.end());
  state.counters["p50_us"] = micros[micros.size() / 2];
  state.counters["p99_us"] = micros[std::min(micros.size() - 1, micros.size() * 99 / 100)];
}

template <typename Fn>
void timed_loop(benchmark::State& state, size_t bytes, Fn&& one_call) {
  std::vector<double> micros;
  micros.reserve(1 << 16);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    one_call();
    micros.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  report(state, micros, bytes);
}

void BM_Put(benchmark::State& state, const std::string& transports) {
  Loopback& lb = loopback(transports);
  state.SetLabel(lb.client->transport());
  const auto bytes = static_cast<size_t>(state.range(0));
  const auto payload = std::span<const uint8_t>(lb.client_arena).first(bytes);
  const std::function<std::span<uint8_t>(std::span<const uint8_t>, size_t)> no_sink;
  timed_loop(state, bytes, [&] {
    const Reply reply = lb.client->call(kOpPut, {}, payload, no_sink, std::chrono::seconds(10));
    benchmark::DoNotOptimize(reply.status);
  });
}

void BM_Get(benchmark::State& state, const std::string& transports) {
  Loopback& lb = loopback(transports);
  state.SetLabel(lb.client->transport());
  const auto bytes = static_cast<uint64_t>(state.range(0));
  std::vector<uint8_t> header(sizeof(bytes));
  std::memcpy(header.data(), &bytes, sizeof(bytes));
  const std::function<std::span<uint8_t>(std::span<const uint8_t>, size_t)> sink =
      [&](std::span<const uint8_t>, size_t n) { return std::span<uint8_t>(lb.client_arena).subspan(kMaxBlock, n); };
  timed_loop(state, bytes, [&] {
    const Reply reply = lb.client->call(kOpGet, header, {}, sink, std::chrono::seconds(10));
    benchmark::DoNotOptimize(reply.payload_bytes);
  });
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> from(bytes, 1), to(bytes);
  timed_loop(state, bytes, [&] {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
  });
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t kib : {4, 16, 64, 256, 1024, 4096}) b->Arg(kib * 1024);
  b->UseRealTime();  // the work happens on the progress threads
}

BENCHMARK_CAPTURE(BM_Put, tcp, std::string("tcp"))->Apply(sizes);
BENCHMARK_CAPTURE(BM_Get, tcp, std::string("tcp"))->Apply(sizes);
BENCHMARK_CAPTURE(BM_Put, shm, std::string("shm"))->Apply(sizes);
BENCHMARK_CAPTURE(BM_Get, shm, std::string("shm"))->Apply(sizes);
BENCHMARK(BM_Memcpy)->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
