// The worker over gRPC: a WorkerService around a LocalWorker on the tiny
// model, served by a real grpc::Server on loopback, driven through
// RemoteWorker. The scheduler must not be able to tell it from the
// in-process worker; a dead worker must fail fast and a restarted one must be
// used again.
#include "coordinator/worker_client/remote_worker.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <thread>

#include "common/error.h"
#include "common/rpc/grpc_server.h"
#include "common/metrics/metric_names.h"
#include "coordinator/scheduler/scheduler.h"
#include "tests/unit/step_plans.h"
#include "tests/unit/tiny_model_fixture.h"
#include "worker/local_worker.h"
#include "worker/service/worker_service.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<std::string, float>>> top;
  std::string text;
  std::string finish;
  std::string error;
  bool unavailable = false;
  int64_t evicted = 0;  // slots its policy evicted, as its tokens report them
};

// Every event of the handles' stream to the end, with a generous deadline so a
// bug cannot hang the test. `on_event` sees each event as it arrives.
std::vector<Outcome> collect(const std::vector<SequenceHandle>& handles,
                             const std::function<void(const SequenceEvent&)>& on_event = {}) {
  std::vector<Outcome> out(handles.size());
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < handles.size(); ++i) index[handles[i].id] = i;
  size_t done = 0;
  const auto deadline = Clock::now() + 120s;
  while (done < handles.size() && Clock::now() < deadline) {
    for (SequenceEvent& e : handles.front().stream->wait(50ms)) {
      if (on_event) on_event(e);
      Outcome& o = out[index.at(e.sequence)];
      o.text += e.text;
      if (e.kind == SequenceEvent::Kind::kToken) {
        o.tokens.push_back(e.token.id);
        o.logprobs.push_back(e.token.logprob);
        o.top.push_back(e.token.top);
        o.evicted += e.token.evicted_slots;
      } else {
        o.finish = e.finish_reason;
        o.error = e.error;
        o.unavailable = e.unavailable;
        ++done;
      }
    }
  }
  EXPECT_EQ(done, handles.size()) << "sequences did not finish before the deadline";
  return out;
}

bool wait_until(const std::function<bool()>& condition, Clock::duration limit) {
  const auto deadline = Clock::now() + limit;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

class WorkerRpcTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TinyModelSpec spec;
    spec.n_ctx = 256;
    TinyModel tiny = load_tiny_model("worker_rpc_test", spec);
    model_ = tiny.model.release();
    tokenizer_ = tiny.tokenizer.release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
  }

  static LocalWorkerOptions worker_options(size_t capacity = 0) {
    LocalWorkerOptions o;
    o.threads = 2;
    o.n_vocab = tokenizer_->n_vocab();
    o.kv_capacity_bytes = capacity;
    return o;
  }

  // A LocalWorker served over gRPC on 127.0.0.1:port (0: any free port).
  struct ServedWorker {
    explicit ServedWorker(int port, size_t capacity = 0)
        : worker(*model_, worker_options(capacity)),
          service(worker, {.sequences = [this] { return int64_t(worker.n_sequences()); },
                           .release_all = [this] { worker.release_all(); },
                           .join = {}}),
          server(std::make_unique<GrpcServer>("127.0.0.1", port, service, WorkerService::kServiceName,
                                              kMaxWorkerMessageBytes)),
          port(server->port()) {}
    ~ServedWorker() { server->shutdown(std::chrono::steady_clock::now()); }
    std::string address() const { return "127.0.0.1:" + std::to_string(port); }
    LocalWorker worker;
    WorkerService service;
    std::unique_ptr<GrpcServer> server;
    int port = 0;  // after server: initialised from it
  };

  static RemoteWorkerOptions fast_heartbeats(metrics::Registry* registry = nullptr) {
    RemoteWorkerOptions o;
    o.connect_timeout = 20s;
    o.heartbeat_interval = 100ms;
    o.heartbeat_misses = 3;
    o.metrics = registry;
    return o;
  }

  static SequenceRequest request(int i, int32_t max_new, PolicyConfig policy = make_policy_config("full")) {
    SequenceRequest r;
    r.prompt = {1};
    for (int k = 0; k < 6 + 3 * i; ++k) r.prompt.push_back(3 + (17 * i + 5 * k) % 250);
    r.max_new_tokens = max_new;
    r.policy = std::move(policy);
    r.top_logprobs = i % 2 == 0 ? 3 : -1;
    return r;
  }

  // `counters`, when given, gets the run's evictions and preemptions.
  static std::vector<Outcome> run(StepExecutor& worker, const std::vector<SequenceRequest>& requests,
                                  std::pair<double, double>* counters = nullptr) {
    metrics::Registry registry;
    SchedulerOptions options;
    options.max_batch = 4;  // more sequences than slots: admissions mid-run
    // Prompt chunks sized by measured step time would make the two runs' steps
    // differ, and with them the f32 kernels' summation order and the logprobs.
    options.max_decode_stall = std::chrono::milliseconds(0);
    std::vector<Outcome> out;
    {
      Scheduler scheduler(worker, *tokenizer_, registry, options);
      out = collect(scheduler.submit(requests));
    }
    if (counters) {
      *counters = {registry.counter(metrics::kEvictions).value(), registry.counter(metrics::kPreemptions).value()};
    }
    return out;
  }

  static void expect_same(const std::vector<Outcome>& remote, const std::vector<Outcome>& local) {
    ASSERT_EQ(remote.size(), local.size());
    for (size_t i = 0; i < local.size(); ++i) {
      EXPECT_FALSE(local[i].tokens.empty()) << "sequence " << i;
      EXPECT_EQ(remote[i].tokens, local[i].tokens) << "sequence " << i;
      EXPECT_EQ(remote[i].logprobs, local[i].logprobs) << "sequence " << i;
      EXPECT_EQ(remote[i].top, local[i].top) << "sequence " << i;
      EXPECT_EQ(remote[i].text, local[i].text) << "sequence " << i;
      EXPECT_EQ(remote[i].finish, local[i].finish) << "sequence " << i;
      EXPECT_EQ(remote[i].error, local[i].error) << "sequence " << i;
      EXPECT_EQ(remote[i].evicted, local[i].evicted) << "sequence " << i;
    }
  }

  static Model* model_;
  static Tokenizer* tokenizer_;
};

Model* WorkerRpcTest::model_ = nullptr;
Tokenizer* WorkerRpcTest::tokenizer_ = nullptr;

TEST_F(WorkerRpcTest, InfoMatchesTheLocalWorker) {
  ServedWorker served(0);
  ASSERT_GT(served.port, 0);
  RemoteWorker remote(served.address(), fast_heartbeats());
  const WorkerInfo local = served.worker.info();
  const WorkerInfo info = remote.info();
  EXPECT_EQ(info.n_ctx, local.n_ctx);
  EXPECT_EQ(info.n_vocab, local.n_vocab);
  EXPECT_EQ(info.kv_capacity_bytes, local.kv_capacity_bytes);
  EXPECT_EQ(info.kv_bytes_per_token, local.kv_bytes_per_token);
  EXPECT_EQ(info.kv_page_bytes, local.kv_page_bytes);
  EXPECT_EQ(info.page_slots, local.page_slots);
  EXPECT_EQ(info.n_layer, local.n_layer);
  EXPECT_EQ(info.n_head_kv, local.n_head_kv);
  EXPECT_EQ(info.n_group, local.n_group);
  EXPECT_EQ(info.unavailable_policies, local.unavailable_policies);
  EXPECT_EQ(info.unavailable_policies.count("triattention"), 1u);  // the tiny model has no query statistics
  EXPECT_TRUE(remote.alive());
  EXPECT_EQ(remote.instance_id(), served.service.instance_id());
}

TEST_F(WorkerRpcTest, SchedulerOverRemoteWorkerGivesTheSameTokensAsInProcess) {
  std::vector<SequenceRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(request(i, 20 + 5 * i));
  // Evicting policies, with outputs long enough to evict.
  requests.push_back(request(6, 90, make_policy_config("lazy", {{"budget", "32"}, {"window", "8"}})));
  requests.push_back(request(7, 90, make_policy_config("streaming", {{"budget", "24"}, {"sinks", "4"}})));
  requests.push_back(request(8, 90, make_policy_config("h2o", {{"budget", "24"}})));

  LocalWorker local_worker(*model_, worker_options());
  std::pair<double, double> local_counters, remote_counters;
  const std::vector<Outcome> local = run(local_worker, requests, &local_counters);

  ServedWorker served(0);
  RemoteWorker remote(served.address(), fast_heartbeats());
  const std::vector<Outcome> over_rpc = run(remote, requests, &remote_counters);
  expect_same(over_rpc, local);
  EXPECT_GT(local_counters.first, 0) << "the evicting policies evicted nothing";
  EXPECT_EQ(remote_counters.first, local_counters.first);
  // Each sequence's tokens carry its own evictions: together, the step totals.
  int64_t per_sequence = 0;
  for (const Outcome& o : local) per_sequence += o.evicted;
  EXPECT_EQ(double(per_sequence), local_counters.first);
  EXPECT_EQ(local[0].evicted, 0) << "the full policy evicts nothing";
  EXPECT_GT(served.service.steps(), 0);
  // Every finished sequence was released on the worker.
  EXPECT_TRUE(wait_until([&] { return served.worker.n_sequences() == 0; }, 10s));
}

TEST_F(WorkerRpcTest, PreemptionOverRpcMatchesInProcess) {
  // A cache too small for every sequence at once: out_of_memory crosses the wire
  // and the scheduler preempts exactly as with the in-process worker.
  std::vector<SequenceRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(request(i, 60));
  const size_t capacity = LocalWorker(*model_, worker_options()).info().kv_page_bytes *
                          size_t(model_->config().n_layer) * size_t(model_->config().n_head_kv) * 5;
  LocalWorker local_worker(*model_, worker_options(capacity));
  std::pair<double, double> local_counters, remote_counters;
  const std::vector<Outcome> local = run(local_worker, requests, &local_counters);

  ServedWorker served(0, capacity);
  RemoteWorker remote(served.address(), fast_heartbeats());
  expect_same(run(remote, requests, &remote_counters), local);
  EXPECT_GT(local_counters.second, 0) << "nothing was preempted";
  EXPECT_EQ(remote_counters.second, local_counters.second);
}

TEST_F(WorkerRpcTest, ABadPolicyFailsOneSequenceNotTheStep) {
  ServedWorker served(0);
  RemoteWorker remote(served.address(), fast_heartbeats());
  StepPlan plan;
  SequenceStart good;
  good.seq = 1;
  good.prompt = {1, 5, 9};
  SequenceStart bad = good;
  bad.seq = 2;
  bad.policy = make_policy_config("lazy", {{"budget", "32"}, {"window", "8"}});
  bad.policy.params["budget"] = -3;  // what make_policy_config would never produce
  plan.start = {good, bad};
  plan.items = {{1, 3, {}}, {2, 3, {}}};
  const StepResult result = remote.step(plan);
  ASSERT_EQ(result.tokens.size(), 1u);
  EXPECT_EQ(result.tokens[0].seq, 1);
  EXPECT_GE(result.tokens[0].token, 0);
  ASSERT_FALSE(result.failed.empty());
  EXPECT_EQ(result.failed[0].first, 2);
  EXPECT_NE(result.failed[0].second.find("budget"), std::string::npos) << result.failed[0].second;
  EXPECT_EQ(result.invalid, std::vector<SeqId>{2});  // the request's fault: the client gets a 400
  EXPECT_EQ(served.worker.n_sequences(), 1u);
}

// A coordinator that dies without releasing its sequences (SIGKILL) leaves
// them on the worker; the next coordinator's first plan drops them, so their
// KV is freed and the new coordinator's ids, which start again at 1, are free.
TEST_F(WorkerRpcTest, ANewCoordinatorSessionDropsTheSequencesTheLastOneLeft) {
  ServedWorker served(0);
  {
    RemoteWorker crashed(served.address(), fast_heartbeats());
    ASSERT_TRUE(crashed.step(plan_starting(1, {1, 5, 9})).failed.empty());
    ASSERT_TRUE(crashed.step(plan_starting(2, {1, 6, 9})).failed.empty());
    EXPECT_EQ(served.worker.n_sequences(), 2u);
  }
  EXPECT_EQ(served.worker.n_sequences(), 2u) << "nothing was released when the coordinator went";
  RemoteWorker next(served.address(), fast_heartbeats());
  const StepResult result = next.step(plan_starting(1, {1, 7, 9}));
  EXPECT_TRUE(result.failed.empty()) << result.failed.front().second;
  ASSERT_EQ(result.tokens.size(), 1u);
  EXPECT_EQ(served.worker.n_sequences(), 1u) << "only the new session's sequence is held";
  // The same session keeps its sequences from step to step.
  StepPlan decode;
  decode.items = {{1, 0, {}}};
  EXPECT_TRUE(next.step(decode).failed.empty());
  EXPECT_EQ(served.worker.n_sequences(), 1u);
}

// A StepExecutor whose step waits until released: a slow worker.
class BlockingExecutor final : public StepExecutor {
 public:
  WorkerInfo info() const override {
    WorkerInfo info;
    info.n_ctx = 64;
    info.n_vocab = 10;
    return info;
  }
  StepResult step(const StepPlan&) override {
    std::unique_lock lock(mutex_);
    released_.wait(lock, [&] { return release_; });
    return {};
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      release_ = true;
    }
    released_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  bool release_ = false;
};

TEST_F(WorkerRpcTest, AStepPastItsDeadlineThrowsUnavailableAndHeartbeatsGoOn) {
  BlockingExecutor executor;
  WorkerService service(executor);
  int port = 0;
  auto server = std::make_unique<GrpcServer>("127.0.0.1", 0, service, WorkerService::kServiceName,
                                             kMaxWorkerMessageBytes);
  port = server->port();
  RemoteWorkerOptions options = fast_heartbeats();
  options.step_timeout = 300ms;
  RemoteWorker remote("127.0.0.1:" + std::to_string(port), options);
  StepPlan plan;
  plan.items = {{1, 0, {}}};
  try {
    remote.step(plan);
    ADD_FAILURE() << "a step past its deadline returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("deadline"), std::string::npos) << e.what();
  }
  // Heartbeats are answered while a step runs: a slow step is not a dead worker.
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(remote.alive());
  executor.release();
  server->shutdown(std::chrono::steady_clock::now() + 5s);
}

TEST_F(WorkerRpcTest, ConnectingToNothingFailsWithUnavailableNamingTheAddress) {
  // A port that was free a moment ago.
  int port = 0;
  {
    ServedWorker served(0);
    port = served.port;
  }
  RemoteWorkerOptions options = fast_heartbeats();
  options.connect_timeout = 500ms;
  const std::string address = "127.0.0.1:" + std::to_string(port);
  try {
    RemoteWorker remote(address, options);
    ADD_FAILURE() << "connected to a closed port";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
  }
  EXPECT_THROW(RemoteWorker("no-port-here", options), Error);
}

TEST_F(WorkerRpcTest, ADeadWorkerFailsFastAndARestartedOneIsUsedAgain) {
  auto served = std::make_unique<ServedWorker>(0);
  const int port = served->port;
  const std::string address = served->address();
  metrics::Registry registry;
  RemoteWorkerOptions options = fast_heartbeats(&registry);
  RemoteWorker remote(address, options);
  metrics::Gauge& up = registry.gauge(metrics::kWorkerUp, {"0"});
  EXPECT_EQ(up.value(), 1);
  const uint64_t first_instance = remote.instance_id();
  EXPECT_NE(first_instance, 0u);

  const std::vector<SequenceRequest> reference_requests = {request(1, 12)};
  LocalWorker local_worker(*model_, worker_options());
  const std::vector<Outcome> reference = run(local_worker, reference_requests);

  SchedulerOptions scheduler_options;
  Scheduler scheduler(remote, *tokenizer_, registry, scheduler_options);

  // The worker goes away while a long sequence runs: it ends with a clear
  // "unavailable" error naming the worker instead of hanging.
  SequenceRequest long_request = request(2, 200);
  long_request.ignore_eos = true;
  std::vector<SequenceHandle> handles = scheduler.submit({long_request});
  bool killed = false;
  const std::vector<Outcome> cut = collect(handles, [&](const SequenceEvent& e) {
    if (!killed && e.kind == SequenceEvent::Kind::kToken) {
      served.reset();
      killed = true;
    }
  });
  ASSERT_TRUE(killed);
  EXPECT_EQ(cut[0].finish, "error");
  EXPECT_TRUE(cut[0].unavailable);
  EXPECT_NE(cut[0].error.find(address), std::string::npos) << cut[0].error;
  EXPECT_LT(cut[0].tokens.size(), 200u);

  // Declared dead within misses * interval plus slack; the metric follows.
  EXPECT_TRUE(wait_until([&] { return !remote.alive(); }, 30s));
  EXPECT_EQ(up.value(), 0);
  StepPlan decode;
  decode.items = {{1, 0, {}}};
  try {
    remote.step(decode);
    ADD_FAILURE() << "a step on a dead worker returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("declared dead"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
  }
  // Releases alone are kept for later rather than failing (no busy retry loop).
  StepPlan release_only;
  release_only.release = {1};
  EXPECT_NO_THROW(remote.step(release_only));

  // A new request while the worker is dead fails with an error, not a hang.
  const std::vector<Outcome> refused = collect(scheduler.submit(reference_requests));
  EXPECT_EQ(refused[0].finish, "error");
  EXPECT_TRUE(refused[0].unavailable);
  EXPECT_NE(refused[0].error.find("declared dead"), std::string::npos) << refused[0].error;

  // A worker restarted on the same port is used again.
  served = std::make_unique<ServedWorker>(port);
  EXPECT_TRUE(wait_until([&] { return remote.alive(); }, 30s));
  EXPECT_EQ(up.value(), 1);
  EXPECT_NE(remote.instance_id(), first_instance);
  const std::vector<Outcome> again = collect(scheduler.submit(reference_requests));
  expect_same(again, reference);
  EXPECT_TRUE(wait_until([&] { return served->worker.n_sequences() == 0; }, 10s));
}

}  // namespace
}  // namespace lazykv
