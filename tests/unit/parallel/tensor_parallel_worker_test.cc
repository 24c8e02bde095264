#include "coordinator/worker_client/tensor_parallel_worker.h"

#include <gtest/gtest.h>

#include <atomic>

#include "common/error.h"

namespace lazykv {
namespace {

struct FakeRank final : StepExecutor {
  WorkerInfo info_;
  StepResult result;
  bool fail = false;
  std::atomic<int>* steps = nullptr;
  WorkerInfo info() const override { return info_; }
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

std::vector<TensorParallelRank> group_of(std::vector<std::unique_ptr<FakeRank>> fakes) {
  std::vector<TensorParallelRank> ranks;
  for (size_t i = 0; i < fakes.size(); ++i) ranks.push_back({std::move(fakes[i]), "worker w" + std::to_string(i), {}});
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
    ranks.push_back({std::move(fake), "worker w" + std::to_string(i), [i] { return i == 0; }});
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

  std::vector<std::unique_ptr<FakeRank>> mismatched;
  mismatched.push_back(rank_with(5));
  mismatched.push_back(rank_with(5));
  mismatched[1]->info_.n_vocab = 99;
  EXPECT_THROW(TensorParallelWorker{group_of(std::move(mismatched))}, Error);
}

}  // namespace
}  // namespace lazykv
