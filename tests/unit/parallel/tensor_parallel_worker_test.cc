#include "coordinator/worker_client/tensor_parallel_worker.h"

#include <gtest/gtest.h>

#include <atomic>

#include "common/error.h"
#include "tests/unit/step_plans.h"

namespace lazykv {
namespace {

struct FakeRank final : StepExecutor {
  WorkerInfo info_;
  StepResult result;
  bool fail = false;
  bool up = true;
  std::atomic<int>* steps = nullptr;
  WorkerInfo info() const override { return info_; }
  bool alive() const override { return up; }
  StepResult step(const StepPlan&) override {
    if (steps != nullptr) ++*steps;
    if (fail) throw Error(ErrorCode::kUnavailable, "connection refused");
    return result;
  }
};

WorkerInfo info_with(int n_head_kv, size_t capacity) {
  WorkerInfo i;
  i.n_vocab = 100;
  i.n_ctx = 64;
  i.n_layer = 2;
  i.n_head_kv = n_head_kv;
  i.page_slots = 16;
  i.kv_capacity_bytes = capacity;
  return i;
}

std::unique_ptr<FakeRank> rank_with(int32_t token, int n_head_kv = 1, size_t capacity = 0) {
  auto r = std::make_unique<FakeRank>();
  r->info_ = info_with(n_head_kv, capacity);
  r->result.tokens.push_back({1, token, 0.0f, {}});
  r->result.kv_slots = 10;
  return r;
}

// Ranks 0..N-1 of a group of N, in order.
std::vector<TensorParallelRank> group_of(std::vector<std::unique_ptr<FakeRank>> fakes) {
  std::vector<TensorParallelRank> ranks;
  for (size_t i = 0; i < fakes.size(); ++i) {
    fakes[i]->info_.rank = int(i);
    fakes[i]->info_.world = int(fakes.size());
    ranks.push_back({std::move(fakes[i]), "worker w" + std::to_string(i), {}});
  }
  return ranks;
}

TEST(TensorParallelWorker, ReturnsRankZerosTokensAndTheGroupsSlots) {
  std::vector<std::unique_ptr<FakeRank>> fakes;
  fakes.push_back(rank_with(5));
  fakes.push_back(rank_with(9));  // ignored: only rank 0 samples for the group
  TensorParallelWorker group(group_of(std::move(fakes)));
  const StepResult r = group.step(StepPlan{});
  ASSERT_EQ(r.tokens.size(), 1u);
  EXPECT_EQ(r.tokens[0].token, 5);
  EXPECT_EQ(r.kv_slots, 20);
}

TEST(TensorParallelWorker, AFailedRankFailsTheStepNamingIt) {
  std::vector<std::unique_ptr<FakeRank>> fakes;
  fakes.push_back(rank_with(5));
  fakes.push_back(rank_with(5));
  fakes[1]->fail = true;
  TensorParallelWorker group(group_of(std::move(fakes)));
  try {
    group.step(StepPlan{});
    FAIL() << "the step should fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("worker w1 (rank 1)"), std::string::npos) << e.what();
  }
}

TEST(TensorParallelWorker, RanksThatDisagreeFailTheStep) {
  std::vector<std::unique_ptr<FakeRank>> fakes;
  fakes.push_back(rank_with(5));
  fakes.push_back(rank_with(5));
  fakes[1]->result.out_of_memory = true;
  TensorParallelWorker group(group_of(std::move(fakes)));
  EXPECT_THROW(group.step(StepPlan{}), Error);
}

TEST(TensorParallelWorker, ADownRankStopsTheStepBeforeAnyRankStarts) {
  std::atomic<int> steps{0};
  std::vector<TensorParallelRank> ranks;
  for (int i = 0; i < 2; ++i) {
    auto fake = rank_with(5);
    fake->steps = &steps;
    fake->info_.rank = i;
    fake->info_.world = 2;
    fake->up = i == 0;
    ranks.push_back({std::move(fake), "worker w" + std::to_string(i), {}});
  }
  TensorParallelWorker group(std::move(ranks));
  EXPECT_THROW(group.step(StepPlan{}), Error);
  EXPECT_EQ(steps.load(), 0);
}

TEST(TensorParallelWorker, ReportsTheTightestRanksCacheAndRefusesMismatchedModels) {
  std::vector<std::unique_ptr<FakeRank>> fakes;
  fakes.push_back(rank_with(5, 2, 1000));
  fakes.push_back(rank_with(5, 1, 400));  // 400 per head < 500 per head
  TensorParallelWorker group(group_of(std::move(fakes)));
  EXPECT_EQ(group.info().kv_capacity_bytes, 400u);
  EXPECT_EQ(group.info().n_head_kv, 1);

  // A policy one rank cannot run, the group cannot run.
  std::vector<std::unique_ptr<FakeRank>> lacking;
  lacking.push_back(rank_with(5, 1, 400));
  lacking.push_back(rank_with(5, 1, 1000));
  lacking[1]->info_.unavailable_policies["triattention"] = "no statistics";
  EXPECT_EQ(TensorParallelWorker(group_of(std::move(lacking))).info().unavailable_policies,
            (std::map<std::string, std::string>{{"triattention", "no statistics"}}));

  std::vector<std::unique_ptr<FakeRank>> mismatched;
  mismatched.push_back(rank_with(5));
  mismatched.push_back(rank_with(5));
  mismatched[1]->info_.n_vocab = 99;
  EXPECT_THROW(TensorParallelWorker{group_of(std::move(mismatched))}, Error);
}

TEST(TensorParallelWorker, RefusesRanksOutOfOrderOrFromAnotherWorld) {
  std::vector<std::unique_ptr<FakeRank>> fakes;
  fakes.push_back(rank_with(5));
  fakes.push_back(rank_with(5));
  std::vector<TensorParallelRank> swapped = group_of(std::move(fakes));
  std::swap(swapped[0], swapped[1]);
  try {
    TensorParallelWorker group(std::move(swapped));
    FAIL() << "ranks out of order were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("is rank 1 of 2, but it is --worker number 0"), std::string::npos)
        << e.what();
  }
  std::vector<std::unique_ptr<FakeRank>> solo;
  solo.push_back(rank_with(5));
  solo.push_back(rank_with(5));
  std::vector<TensorParallelRank> ranks = group_of(std::move(solo));
  static_cast<FakeRank*>(ranks[1].executor.get())->info_.world = 3;
  EXPECT_THROW(TensorParallelWorker{std::move(ranks)}, Error);
}

// The group forms at construction and again, before the next step, after a
// rank's process changed; a step that continues a sequence from before then
// fails (its KV is gone on every rank), one that only starts sequences runs.
TEST(TensorParallelWorker, FormsTheGroupAgainAfterARankRestarted) {
  std::vector<std::unique_ptr<FakeRank>> fakes;
  fakes.push_back(rank_with(5));
  fakes.push_back(rank_with(5));
  std::vector<TensorParallelRank> ranks = group_of(std::move(fakes));
  std::atomic<uint64_t> instance1{11};
  ranks[0].instance = [] { return uint64_t(10); };
  ranks[1].instance = [&] { return instance1.load(); };
  int formed = 0;
  bool fail_forming = false;
  TensorParallelWorker group(std::move(ranks), [&] {
    if (fail_forming) throw Error(ErrorCode::kUnavailable, "rank 1 did not join in time");
    ++formed;
    return std::vector<uint64_t>{};  // unknown: the heartbeats' ids count
  });
  EXPECT_EQ(formed, 1);
  StepPlan decode;
  decode.items = {{1, 0, {}}};
  group.step(decode);
  EXPECT_EQ(formed, 1) << "formed again with no restart";

  instance1 = 12;  // rank 1 restarted
  fail_forming = true;
  EXPECT_THROW(group.step(decode), Error);
  fail_forming = false;
  try {
    group.step(decode);
    FAIL() << "a step continuing a lost sequence ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("formed again after worker w1 restarted"), std::string::npos) << e.what();
  }
  EXPECT_EQ(formed, 2);
  EXPECT_EQ(group.groups_formed(), 2);
  const StepPlan fresh = plan_starting(2, {1, 2, 3});
  EXPECT_NO_THROW(group.step(fresh));
  EXPECT_EQ(formed, 2);
}

// A failed step (a collective timed out on some rank) may leave the ranks'
// communicators broken: the group forms again before the next step.
TEST(TensorParallelWorker, FormsTheGroupAgainAfterAFailedStep) {
  std::vector<std::unique_ptr<FakeRank>> fakes;
  fakes.push_back(rank_with(5));
  fakes.push_back(rank_with(5));
  FakeRank* rank1 = fakes[1].get();
  int formed = 0;
  TensorParallelWorker group(group_of(std::move(fakes)), [&] {
    ++formed;
    return std::vector<uint64_t>{};
  });
  EXPECT_EQ(formed, 1);
  rank1->fail = true;
  EXPECT_THROW(group.step(StepPlan{}), Error);
  EXPECT_EQ(formed, 1);
  rank1->fail = false;
  EXPECT_NO_THROW(group.step(StepPlan{}));
  EXPECT_EQ(formed, 2);
  EXPECT_NO_THROW(group.step(StepPlan{}));
  EXPECT_EQ(formed, 2);
}

// Rank 1 restarted and a step failed before its heartbeat showed the new
// process: the group re-forms with the new process (whose id the rank
// reports on joining). The heartbeat catching up later is not a restart, so
// the sequences of the new group are not dropped again; a real second
// restart is.
TEST(TensorParallelWorker, AHeartbeatOlderThanTheGroupIsNotARestart) {
  std::vector<std::unique_ptr<FakeRank>> fakes;
  fakes.push_back(rank_with(5));
  fakes.push_back(rank_with(5));
  FakeRank* rank1 = fakes[1].get();
  std::vector<TensorParallelRank> ranks = group_of(std::move(fakes));
  std::atomic<uint64_t> heartbeat1{11}, process1{11};
  ranks[0].instance = [] { return uint64_t(10); };
  ranks[1].instance = [&] { return heartbeat1.load(); };
  int formed = 0;
  TensorParallelWorker group(std::move(ranks), [&] {
    ++formed;
    return std::vector<uint64_t>{10, process1.load()};
  });
  StepPlan decode;
  decode.items = {{1, 0, {}}};
  group.step(decode);

  process1 = 12;  // rank 1 restarts; its next step fails
  rank1->fail = true;
  EXPECT_THROW(group.step(decode), Error);
  rank1->fail = false;
  const StepPlan fresh = plan_starting(2, {1, 2, 3});
  group.step(fresh);  // forms again, with process 12, while the heartbeat still shows 11
  EXPECT_EQ(formed, 2);
  StepPlan continue2;
  continue2.items = {{2, 0, {}}};
  EXPECT_NO_THROW(group.step(continue2));
  heartbeat1 = 12;  // the heartbeat catches up
  EXPECT_NO_THROW(group.step(continue2));
  EXPECT_EQ(formed, 2) << "the heartbeat catching up was taken for a restart";

  process1 = heartbeat1 = 13;  // a real restart
  EXPECT_THROW(group.step(continue2), Error);
  EXPECT_EQ(formed, 3);
}

}  // namespace
}  // namespace lazykv
