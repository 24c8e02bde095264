// lazy+tiers driven step by step with chosen attention hits on a one-head
// cache: a recurring token is demoted when evicted, fetched one window
// before its predicted recurrence, promoted back with its exact K/V bytes
// and state, and its next hit counts as a promotion hit. Without tiers the
// policy evicts exactly like lazy; when the kvstore dies mid-run the worker
// goes on without tiers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/fp16.h"
#include "common/rpc/grpc_server.h"
#include "kvstore/service/kvstore_service.h"
#include "worker/kv_cache.h"
#include "worker/policy/policy.h"
#include "worker/tiers/tier_mover.h"

namespace lazykv {
namespace {

constexpr int kDim = 8;
constexpr int32_t kPrompt = 8;
constexpr int32_t kRecurring = 2;  // the prompt position that recurs every 8 steps

// K and V rows that name their position, so a wrong row is visible.
std::vector<uint16_t> row_of(int32_t pos, float salt) {
  std::vector<uint16_t> row(kDim);
  for (int d = 0; d < kDim; ++d) row[size_t(d)] = fp32_to_fp16(float(pos) + salt + 0.125f * float(d));
  return row;
}

// One decode step at a time. Every slot is hit at every step except the
// recurring token, which is hit only at steps 2, 10 and 21 (when it is in
// the cache): its recurrence interval is 8 by step 10, it is evicted at
// step 12, predicted back at 18 and really used at 21.
class Driver {
 public:
  explicit Driver(const std::string& policy_name, int32_t budget = 16, int32_t window = 4)
      : cache_({1, 1, kDim, 8, 0}) {
    const PolicyConfig config =
        make_policy_config(policy_name, policy_name == "lazy"
                                            ? std::map<std::string, std::string>{{"budget", std::to_string(budget)},
                                                                                 {"window", std::to_string(window)},
                                                                                 {"alpha", "0.5"}}
                                            : std::map<std::string, std::string>{{"budget", std::to_string(budget)},
                                                                                 {"window", std::to_string(window)},
                                                                                 {"alpha", "0.5"},
                                                                                 {"probe", "0"}});
    PolicyShape shape;
    shape.n_layer = 1;
    shape.n_head_kv = 1;
    shape.head_dim = kDim;
    shape.prompt_len = kPrompt;
    policy_ = make_policy(config, shape);
    cache_.add_sequence(0, policy_->heads_per_layer());
    cache_.reserve(0, kPrompt);
    policy_->begin_step(0, kPrompt);
    for (int32_t p = 0; p < kPrompt; ++p) append(p);
    policy_->end_step(0, cache_, 0);
  }

  std::vector<int32_t> step() {
    const int32_t pos = kPrompt + policy_->step();
    cache_.reserve(0, 1);
    policy_->begin_step(pos, 1);
    append(pos);
    const int32_t t = policy_->step();
    const cpu::AttentionStats* stats = policy_->stats(0, 0, pos);
    const std::span<const int32_t> positions = cache_.positions(0, 0, 0);
    for (size_t i = 0; i < positions.size(); ++i) {
      const bool recurring = positions[i] == kRecurring;
      if (!recurring || t == 2 || t == 10 || t == 21) stats->hits[i] = 1;
    }
    policy_->end_step(0, cache_, 0);
    const std::span<const int32_t> kept = cache_.positions(0, 0, 0);
    return {kept.begin(), kept.end()};
  }

  KvCache& cache() { return cache_; }
  EvictionPolicy& policy() { return *policy_; }

 private:
  void append(int32_t pos) {
    const std::vector<uint16_t> k = row_of(pos, 0.0f), v = row_of(pos, 1000.0f);
    cache_.append(0, 0, 0, pos, k.data(), v.data());
  }
  KvCache cache_;
  std::unique_ptr<EvictionPolicy> policy_;
};

class LazyTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tiers::TierConfig config;
    config.host_tier_bytes = 16 << 20;
    tiers::configure_tiers(config);
  }
  void TearDown() override { tiers::configure_tiers(tiers::TierConfig{}); }
};

TEST_F(LazyTiersTest, ARecurringTokenIsDemotedThenPromotedBackWithItsExactBytes) {
  Driver driver("lazy+tiers");
  std::vector<int32_t> kept;
  for (int t = 1; t <= 12; ++t) kept = driver.step();
  // Step 12: 20 slots, budget 16: the recurring token (the lowest score) leaves.
  ASSERT_EQ(kept.size(), 16u);
  EXPECT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 0);
  const TierCounters after_evict = driver.policy().tier_counters();
  EXPECT_TRUE(after_evict.tiers_available);
  EXPECT_EQ(after_evict.demoted_slots, 4) << "every evicted slot had a recurrence (mri > 0)";
  EXPECT_EQ(after_evict.demoted_bytes, 4 * kDim * 2 * 2);
  for (int t = 13; t <= 19; ++t) kept = driver.step();
  EXPECT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 0);
  // Step 20: its recurrence (last 10 + mri 8 = 18) is due; fetched at step 16, promoted now.
  kept = driver.step();
  ASSERT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 1);
  EXPECT_LE(kept.size(), 16u) << "promotion displaces residents: the budget holds";
  const auto slot = size_t(std::find(kept.begin(), kept.end(), kRecurring) - kept.begin());
  std::vector<uint16_t> k(kDim), v(kDim);
  driver.cache().read_slot(0, 0, 0, int32_t(slot), k.data(), v.data());
  EXPECT_EQ(k, row_of(kRecurring, 0.0f));
  EXPECT_EQ(v, row_of(kRecurring, 1000.0f));
  const nlohmann::json state = driver.policy().slot_state(0, 0);
  EXPECT_EQ(state["last"][slot].get<int32_t>(), 10);
  EXPECT_EQ(state["mri"][slot].get<int32_t>(), 8);
  TierCounters c = driver.policy().tier_counters();
  EXPECT_EQ(c.promoted_slots, 1);
  EXPECT_GE(c.fetched_blocks, 1);
  EXPECT_EQ(c.promotion_hits, 0);
  // Step 21 uses it: a promotion hit.
  driver.step();
  c = driver.policy().tier_counters();
  EXPECT_EQ(c.promotion_hits, 1);
  // Scored low again (interval 11 now), it leaves at step 24 and is demoted again.
  for (int t = 22; t <= 24; ++t) kept = driver.step();
  EXPECT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 0);
  EXPECT_GT(driver.policy().tier_counters().demoted_slots, after_evict.demoted_slots);
}

TEST_F(LazyTiersTest, WithoutTiersItEvictsExactlyLikeLazy) {
  tiers::TierConfig unreachable;
  unreachable.kvstore_address = "127.0.0.1:1";
  tiers::configure_tiers(unreachable);
  Driver lazy("lazy"), tiered("lazy+tiers");
  for (int t = 1; t <= 64; ++t) ASSERT_EQ(lazy.step(), tiered.step()) << "step " << t;
  const TierCounters c = tiered.policy().tier_counters();
  EXPECT_FALSE(c.tiers_available);
  EXPECT_EQ(c.demoted_slots, 0);
  EXPECT_EQ(c.promoted_slots, 0);
}

TEST_F(LazyTiersTest, UntilItsFirstPromotionItEvictsExactlyLikeLazy) {
  Driver lazy("lazy"), tiered("lazy+tiers");
  for (int t = 1; t <= 19; ++t) ASSERT_EQ(lazy.step(), tiered.step()) << "step " << t;
  EXPECT_GT(tiered.policy().tier_counters().demoted_slots, 0);
}

TEST_F(LazyTiersTest, TheKvstoreDyingMidRunTurnsTheTiersOffAndDecodingGoesOn) {
  kvstore::KvstoreServiceOptions options;
  options.tiers.host_capacity_bytes = 16 << 20;
  options.transport.transports = "tcp";
  options.transport.peer_timeout = std::chrono::milliseconds(1000);
  auto service = std::make_unique<kvstore::KvstoreService>(options, nullptr);
  auto control = std::make_unique<GrpcServer>("127.0.0.1", 0, *service, kvstore::KvstoreService::kServiceName);
  tiers::TierConfig config;
  config.kvstore_address = "127.0.0.1:" + std::to_string(control->port());
  config.transports = "tcp";
  tiers::configure_tiers(config);
  Driver driver("lazy+tiers");
  for (int t = 1; t <= 12; ++t) driver.step();
  tiers::process_tiers()->flush();
  EXPECT_EQ(service->tiers().stats().host_blocks, 1u) << "the demoted block reached the kvstore";
  // The kvstore goes away in the middle of the run.
  control.reset();
  service.reset();
  for (int t = 13; t <= 64; ++t) {
    const std::vector<int32_t> kept = driver.step();
    ASSERT_LE(kept.size(), 20u);
  }
  tiers::process_tiers()->flush();
  EXPECT_FALSE(driver.policy().tier_counters().tiers_available);
  EXPECT_FALSE(tiers::process_tiers()->stats().last_error.empty());
}

}  // namespace
}  // namespace lazykv
