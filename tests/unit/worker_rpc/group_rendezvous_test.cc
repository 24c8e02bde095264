// A tensor-parallel group whose rendezvous the coordinator arranges: two
// LocalWorker ranks, each behind its own WorkerService on a real gRPC server
// on loopback, form their Gloo group through form_tensor_parallel_group (the
// JoinGroup relay), run as one TensorParallelWorker of RemoteWorkers, and take
// back a restarted rank by forming the group again.
#include "coordinator/worker_client/group_rendezvous.h"

#include <gloo/rendezvous/store.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/error.h"
#include "common/rpc/grpc_server.h"
#include "coordinator/worker_client/remote_worker.h"
#include "coordinator/worker_client/tensor_parallel_worker.h"
#include "tests/unit/tiny_model_fixture.h"
#include "worker/local_worker.h"
#include "worker/parallel/gloo_group.h"
#include "worker/parallel/group_membership.h"
#include "worker/service/relay_store.h"
#include "worker/service/worker_service.h"
#include "tests/unit/step_plans.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

TEST(RelayStore, PublishesItsOwnEntriesAndWaitsForThePeers) {
  std::vector<std::string> published;
  RelayStore store([&](const std::string& key, const std::vector<char>&) { published.push_back(key); }, 2s);
  store.set("rank_0", {'a'});
  EXPECT_EQ(published, std::vector<std::string>{"rank_0"});
  EXPECT_EQ(store.get("rank_0"), std::vector<char>{'a'});
  std::thread peer([&] {
    std::this_thread::sleep_for(50ms);
    store.deliver("rank_1", {'b', 'c'});
  });
  EXPECT_EQ(store.get("rank_1"), (std::vector<char>{'b', 'c'}));
  peer.join();
  store.wait({"rank_0", "rank_1"});
}

TEST(RelayStore, AMissingKeyFailsAtTheTimeoutOrAtOnceWhenClosed) {
  RelayStore store([](const std::string&, const std::vector<char>&) {}, 200ms);
  const auto start = Clock::now();
  try {
    store.get("rank_1");
    FAIL() << "a key nobody wrote was found";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rank_1"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 190ms);
  RelayStore closed([](const std::string&, const std::vector<char>&) {}, 30s);
  std::thread closer([&] {
    std::this_thread::sleep_for(50ms);
    closed.close("the coordinator ended the rendezvous");
  });
  const auto closed_start = Clock::now();
  try {
    closed.wait({"rank_1"}, 30s);
    FAIL() << "a closed store waited on";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the coordinator ended the rendezvous"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - closed_start, 5s);
  closer.join();
}

class GroupRendezvousTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TinyModelSpec spec;  // 2 KV heads: one per rank
    tiny_ = new TinyModel(load_tiny_model("group_rendezvous_test", spec));
  }
  static void TearDownTestSuite() { delete tiny_; }

  static LocalWorkerOptions options() {
    LocalWorkerOptions o;
    o.threads = 1;
    o.n_vocab = tiny_->tokenizer->n_vocab();
    return o;
  }

  // One `lazykv worker --rank R --world N` on 127.0.0.1:port (0: any).
  struct ServedRank {
    ServedRank(int rank, int world, int port, JoinGroupFn join = {})
        : membership{rank, world},
          worker(*tiny_->model, options(), membership),
          service(worker,
                  {.sequences = [this] { return int64_t(worker.n_sequences()); },
                   .release_all = [this] { worker.release_all(); },
                   .join = join ? join
                                : [this, rank, world](std::chrono::milliseconds timeout, gloo::rendezvous::Store& store) {
                                    worker.release_all();
                                    membership.leave();
                                    GlooGroupOptions o;
                                    o.rank = rank;
                                    o.world = world;
                                    o.timeout = timeout;
                                    membership.join(std::make_unique<GlooGroup>(o, store));
                                  }}),
          server(std::make_unique<GrpcServer>("127.0.0.1", port, service, WorkerService::kServiceName,
                                              kMaxWorkerMessageBytes)) {}
    ~ServedRank() { server->shutdown(Clock::now()); }
    std::string address() const { return "127.0.0.1:" + std::to_string(server->port()); }
    GroupMembership membership;
    LocalWorker worker;
    WorkerService service;
    std::unique_ptr<GrpcServer> server;
  };

  static RemoteWorkerOptions fast_heartbeats() {
    RemoteWorkerOptions o;
    o.connect_timeout = 20s;
    o.heartbeat_interval = 100ms;
    return o;
  }

  // Greedy tokens of one sequence, step by step.
  static std::vector<int32_t> greedy(StepExecutor& executor, SeqId seq, int n) {
    StepPlan plan = plan_starting(seq, {1, 40, 41, 42, 100, 7, 250, 13, 99, 5});
    std::vector<int32_t> tokens;
    for (int i = 0; i < n; ++i) {
      const StepResult r = executor.step(plan);
      EXPECT_TRUE(r.failed.empty()) << (r.failed.empty() ? "" : r.failed[0].second);
      if (r.tokens.size() != 1) break;
      tokens.push_back(r.tokens[0].token);
      plan = StepPlan{};
      plan.items = {{seq, 0, {}}};
    }
    StepPlan release;
    release.release = {seq};
    executor.step(release);
    return tokens;
  }

  static TinyModel* tiny_;
};

TinyModel* GroupRendezvousTest::tiny_ = nullptr;

TEST_F(GroupRendezvousTest, TheCoordinatorFormsTheGroupAndARestartedRankIsTakenBack) {
  LocalWorker whole(*tiny_->model, options());
  const std::vector<int32_t> reference = greedy(whole, 1, 12);
  ASSERT_EQ(reference.size(), 12u);

  auto rank0 = std::make_unique<ServedRank>(0, 2, 0);
  auto rank1 = std::make_unique<ServedRank>(1, 2, 0);
  const int port1 = rank1->server->port();
  // Before the coordinator forms the group a rank refuses steps clearly.
  {
    RemoteWorker lone(rank0->address(), fast_heartbeats());
    try {
      lone.step(plan_starting(9, {1, 2}));
      FAIL() << "a rank ran a step before its group formed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not in a group yet"), std::string::npos) << e.what();
    }
  }

  std::vector<TensorParallelRank> members;
  std::vector<GroupRank> group_ranks;
  for (ServedRank* served : {rank0.get(), rank1.get()}) {
    auto remote = std::make_unique<RemoteWorker>(served->address(), fast_heartbeats());
    RemoteWorker* raw = remote.get();
    group_ranks.push_back({raw->channel(), "worker " + raw->address()});
    members.push_back({std::move(remote), "worker " + raw->address(), [raw] { return raw->instance_id(); }});
  }
  RemoteWorker* remote1 = static_cast<RemoteWorker*>(members[1].executor.get());
  std::vector<uint64_t> joined;
  TensorParallelWorker group(std::move(members), [&] { return joined = form_tensor_parallel_group(group_ranks, 10s); });
  EXPECT_EQ(group.groups_formed(), 1);
  // The ranks report which process joined: the ones the heartbeats show.
  EXPECT_EQ(joined, (std::vector<uint64_t>{rank0->service.instance_id(), rank1->service.instance_id()}));
  EXPECT_EQ(rank0->membership.joins(), 1);
  EXPECT_EQ(greedy(group, 1, 12), reference);

  // Rank 1 restarts on its port (a new process: new instance id, no group).
  const uint64_t before = remote1->instance_id();
  rank1.reset();
  rank1 = std::make_unique<ServedRank>(1, 2, port1);
  const auto deadline = Clock::now() + 20s;
  while ((remote1->instance_id() == before || !remote1->alive()) && Clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(remote1->instance_id(), before) << "the restart was not seen";
  EXPECT_EQ(greedy(group, 2, 12), reference);
  EXPECT_EQ(group.groups_formed(), 2);
  EXPECT_EQ(rank0->membership.joins(), 2);
  EXPECT_EQ(rank1->membership.joins(), 1);
  EXPECT_EQ(rank0->worker.n_sequences(), 0u);
}

// A rank stuck in a collective of the old group (its peer never joined the
// step) holds its step lock until the collective times out. Forming the group
// again waits for that step to end before the rendezvous clocks start, so the
// formation succeeds at the first try instead of timing out the peer.
TEST_F(GroupRendezvousTest, FormingWaitsForARankStillInAStep) {
  LocalWorker whole(*tiny_->model, options());
  const std::vector<int32_t> reference = greedy(whole, 1, 6);
  ServedRank rank0(0, 2, 0);
  ServedRank rank1(1, 2, 0);
  RemoteWorker remote0(rank0.address(), fast_heartbeats());
  RemoteWorker remote1(rank1.address(), fast_heartbeats());
  const std::vector<GroupRank> group_ranks = {{remote0.channel(), "worker a"}, {remote1.channel(), "worker b"}};
  constexpr auto kTimeout = 2s;
  form_tensor_parallel_group(group_ranks, kTimeout);

  // Rank 0 alone starts a step: its first all-reduce waits for rank 1.
  std::thread stuck([&] {
    RemoteWorker direct(rank0.address(), fast_heartbeats());
    EXPECT_THROW(direct.step(plan_starting(5, {1, 2, 3})), Error);  // its collective times out
  });
  std::this_thread::sleep_for(500ms);
  const auto begin = Clock::now();
  const std::vector<uint64_t> joined = form_tensor_parallel_group(group_ranks, kTimeout);
  EXPECT_GE(Clock::now() - begin, 500ms) << "the formation did not wait for the running step";
  stuck.join();
  EXPECT_EQ(joined, (std::vector<uint64_t>{rank0.service.instance_id(), rank1.service.instance_id()}));
  EXPECT_EQ(rank0.membership.joins(), 2);
  EXPECT_EQ(rank1.membership.joins(), 2);

  // The new group runs.
  std::vector<TensorParallelRank> members;
  members.push_back({std::make_unique<RemoteWorker>(rank0.address(), fast_heartbeats()), "worker a", {}});
  members.push_back({std::make_unique<RemoteWorker>(rank1.address(), fast_heartbeats()), "worker b", {}});
  TensorParallelWorker group(std::move(members));
  EXPECT_EQ(greedy(group, 1, 6), reference);
}

// A step that outlasts the formation's timeout fails the formation, naming
// the busy rank, without starting the rendezvous; once the step ended the
// group forms.
TEST_F(GroupRendezvousTest, ARankBusyPastTheTimeoutFailsTheFormationNamingIt) {
  ServedRank rank0(0, 2, 0);
  ServedRank rank1(1, 2, 0);
  RemoteWorker remote0(rank0.address(), fast_heartbeats());
  RemoteWorker remote1(rank1.address(), fast_heartbeats());
  const std::vector<GroupRank> group_ranks = {{remote0.channel(), "worker a"}, {remote1.channel(), "worker b"}};
  form_tensor_parallel_group(group_ranks, 3s);  // collectives now wait up to 3 s
  std::thread stuck([&] {
    RemoteWorker direct(rank0.address(), fast_heartbeats());
    EXPECT_THROW(direct.step(plan_starting(5, {1, 2, 3})), Error);
  });
  std::this_thread::sleep_for(300ms);
  const auto begin = Clock::now();
  try {
    form_tensor_parallel_group(group_ranks, 1s);
    FAIL() << "a group formed around a rank still in a step";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker a (rank 0): rank 0 of 2 (lazykv worker --rank --world) is still "
                                         "running a step after 1000 ms"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - begin, 2500ms);
  EXPECT_EQ(rank1.membership.joins(), 1) << "rank 1 started a rendezvous its peer could not join";
  stuck.join();
  form_tensor_parallel_group(group_ranks, 3s);
  EXPECT_EQ(rank0.membership.joins(), 2);
  EXPECT_EQ(rank1.membership.joins(), 2);
}

TEST_F(GroupRendezvousTest, ARankThatCannotJoinFailsTheGroupAtOnceNamingIt) {
  ServedRank rank0(0, 2, 0);
  ServedRank rank1(1, 2, 0, [](std::chrono::milliseconds, gloo::rendezvous::Store&) {
    throw Error(ErrorCode::kUnavailable, "no route to the peers");
  });
  RemoteWorker remote0(rank0.address(), fast_heartbeats());
  RemoteWorker remote1(rank1.address(), fast_heartbeats());
  const auto start = Clock::now();
  try {
    form_tensor_parallel_group({{remote0.channel(), "worker a"}, {remote1.channel(), "worker b"}}, 20s);
    FAIL() << "a group formed without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("worker b (rank 1)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no route to the peers"), std::string::npos) << e.what();
  }
  // Rank 0 was waiting for rank 1's address: it gives up when the relay ends,
  // long before its 20 s timeout.
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_FALSE(rank0.membership.joined());
}

TEST_F(GroupRendezvousTest, RanksInTheWrongOrderAreRefusedByTheWorkers) {
  ServedRank rank0(0, 2, 0);
  ServedRank rank1(1, 2, 0);
  RemoteWorker remote0(rank0.address(), fast_heartbeats());
  RemoteWorker remote1(rank1.address(), fast_heartbeats());
  try {
    form_tensor_parallel_group({{remote1.channel(), "worker b"}, {remote0.channel(), "worker a"}}, 5s);
    FAIL() << "ranks out of order formed a group";
  } catch (const Error& e) {
    // The first rank to refuse ends the formation; either may be first.
    const std::string what = e.what();
    EXPECT_TRUE(what.find("worker b (rank 0): the coordinator expects rank 0 of 2 here, but this worker is rank 1 of 2") !=
                    std::string::npos ||
                what.find("worker a (rank 1): the coordinator expects rank 1 of 2 here, but this worker is rank 0 of 2") !=
                    std::string::npos)
        << what;
  }
  // A worker started with --world 1 is not a rank at all.
  LocalWorker solo_worker(*tiny_->model, options());
  WorkerService solo(solo_worker);
  GrpcServer server("127.0.0.1", 0, solo, WorkerService::kServiceName, kMaxWorkerMessageBytes);
  RemoteWorker remote_solo("127.0.0.1:" + std::to_string(server.port()), fast_heartbeats());
  EXPECT_THROW(form_tensor_parallel_group({{remote_solo.channel(), "worker s"}}, 5s), Error);
  server.shutdown(Clock::now());
}

}  // namespace
}  // namespace lazykv
