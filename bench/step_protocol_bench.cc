// The coordinator <-> worker control plane on loopback: one step (plan out,
// result back) over the Steps stream, by batch size, against a unary gRPC
// call on the same connection (Info, the floor for a request/response), and
// the tensor-parallel all-reduce over Gloo by size against memcpy of the
// same bytes. The executor behind the service answers at once, so the times
// are the protocol's alone.
#include <benchmark/benchmark.h>
#include <gloo/rendezvous/hash_store.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "common/rpc/grpc_server.h"
#include "coordinator/worker_client/remote_worker.h"
#include "lazykv/worker/v1/worker.grpc.pb.h"
#include "worker/parallel/gloo_group.h"
#include "worker/service/worker_service.h"

namespace lazykv {
namespace {

// One sampled token per decode item, with its logprob: what a real step returns.
class InstantExecutor final : public StepExecutor {
 public:
  WorkerInfo info() const override {
    WorkerInfo info;
    info.n_ctx = 8192;
    info.n_vocab = 49152;
    return info;
  }
  StepResult step(const StepPlan& plan) override {
    StepResult result;
    for (const StepItem& item : plan.items) result.tokens.push_back({item.seq, 42, -0.25f, {}});
    result.batch_tokens = int32_t(plan.items.size());
    return result;
  }
};

struct ServedInstant {
  InstantExecutor executor;
  WorkerService service{executor};
  GrpcServer server{"127.0.0.1", 0, service, WorkerService::kServiceName, kMaxWorkerMessageBytes};
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
};

void BM_StepOverStream(benchmark::State& state) {
  ServedInstant served;
  RemoteWorker remote(served.address());
  StepPlan plan;
  for (int64_t i = 0; i < state.range(0); ++i) plan.items.push_back({SeqId(i + 1), 0, {}});
  for (auto _ : state) {
    const StepResult result = remote.step(plan);
    benchmark::DoNotOptimize(result.tokens.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["batch"] = double(state.range(0));
}
BENCHMARK(BM_StepOverStream)->Arg(1)->Arg(32)->Arg(256)->UseRealTime();

// The reference: a unary call on a gRPC channel to the same server.
void BM_UnaryCall(benchmark::State& state) {
  ServedInstant served;
  auto channel = grpc::CreateChannel(served.address(), grpc::InsecureChannelCredentials());
  auto stub = ::lazykv::worker::v1::Worker::NewStub(channel);
  for (auto _ : state) {
    grpc::ClientContext context;
    ::lazykv::worker::v1::WorkerInfo reply;
    const grpc::Status status = stub->Info(&context, ::lazykv::worker::v1::InfoRequest(), &reply);
    if (!status.ok()) state.SkipWithError(status.error_message().c_str());
  }
}
BENCHMARK(BM_UnaryCall)->UseRealTime();

// Two ranks as threads; the timed loop is rank 0's, rank 1 mirrors it.
void BM_GlooAllReduce(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  gloo::rendezvous::HashStore store;
  GlooGroupOptions options;
  options.world = 2;
  std::unique_ptr<GlooGroup> peer;
  std::thread join([&] {
    GlooGroupOptions o = options;
    o.rank = 1;
    peer = std::make_unique<GlooGroup>(o, store);
  });
  GlooGroup group(options, store);
  join.join();
  // Fixed iterations (below), so the peer knows how many rounds to join.
  const int64_t rounds = int64_t(state.max_iterations);
  std::thread mirror([&] {
    std::vector<float> peer_data(n, 1.0f);
    for (int64_t i = 0; i < rounds; ++i) peer->all_reduce_sum(peer_data.data(), n);
  });
  std::vector<float> data(n, 1.0f);
  for (auto _ : state) group.all_reduce_sum(data.data(), n);
  mirror.join();
  state.SetBytesProcessed(state.iterations() * int64_t(n * sizeof(float)));
}
// 576 floats: one decode token of SmolLM2 (two all-reduces per layer); 18432:
// a batch of 32; 1 Mi floats: a long prefill.
BENCHMARK(BM_GlooAllReduce)->Arg(576)->Arg(576 * 32)->Arg(1 << 16)->Iterations(1000)->UseRealTime();
BENCHMARK(BM_GlooAllReduce)->Arg(1 << 20)->Iterations(50)->UseRealTime();

// The floor for moving the same bytes once inside one process.
void BM_Memcpy(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  std::vector<float> a(n, 1.0f), b(n);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(state.iterations() * int64_t(n * sizeof(float)));
}
BENCHMARK(BM_Memcpy)->Arg(576)->Arg(576 * 32)->Arg(1 << 16)->Arg(1 << 20)->UseRealTime();

}  // namespace
}  // namespace lazykv

BENCHMARK_MAIN();
