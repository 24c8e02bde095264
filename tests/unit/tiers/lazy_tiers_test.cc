// lazy+tiers driven step by step with chosen attention hits on a one-head
// cache: a recurring token is demoted when evicted, its row fetched before
// its predicted recurrence, promoted back with its exact K/V bytes and
// state, and its next hit counts as a promotion hit; evicted again, it goes
// back to the block that still holds it. Without tiers the
// policy evicts exactly like lazy; when the kvstore dies mid-run the worker
// goes on without tiers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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
std::vector<uint16_t> row_of(int32_t pos, float salt, int dim = kDim) {
  std::vector<uint16_t> row(static_cast<size_t>(dim));
  for (int d = 0; d < dim; ++d) row[size_t(d)] = fp32_to_fp16(float(pos) + salt + 0.125f * float(d));
  return row;
}

// One decode step at a time. Every slot is hit at every step except the
// recurring token, which is hit only at steps 2, 10 and 21 (when it is in
// the cache): its recurrence interval is 8 by step 10, it is evicted at
// step 12, predicted back at 18 and really used at 21.
// A test may script the steps otherwise: which slots each step hits, the
// K rows, and the query each step hands the policy (for the probe).
struct Script {
  std::function<bool(int32_t pos, int32_t t)> hit = [](int32_t pos, int32_t t) {
    return pos != kRecurring || t == 2 || t == 10 || t == 21;
  };
  std::function<std::vector<uint16_t>(int32_t pos, int dim)> key = [](int32_t pos, int dim) {
    return row_of(pos, 0.0f, dim);
  };
  std::function<std::vector<float>(int32_t t, int dim)> query;  // empty: none handed over
};

class Driver {
 public:
  // `tiers_params` are added to lazy+tiers' (budget, window, alpha, probe 0).
  explicit Driver(const std::string& policy_name, int32_t budget = 16, int32_t window = 4,
                  std::map<std::string, std::string> tiers_params = {}, int dim = kDim, Script script = {})
      : dim_(dim), script_(std::move(script)), cache_({1, 1, dim, 8, 0}) {
    std::map<std::string, std::string> params{
        {"budget", std::to_string(budget)}, {"window", std::to_string(window)}, {"alpha", "0.5"}};
    if (policy_name == "lazy+tiers") {
      params["probe"] = "0";
      for (const auto& [name, value] : tiers_params) params[name] = value;
    }
    const PolicyConfig config = make_policy_config(policy_name, params);
    PolicyShape shape;
    shape.n_layer = 1;
    shape.n_head_kv = 1;
    shape.head_dim = dim;
    shape.attn_scale = 1.0f / std::sqrt(float(dim));
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
      if (script_.hit(positions[i], t)) stats->hits[i] = 1;
    }
    if (float* query = policy_->query_buffer(0, 0, pos); query != nullptr && script_.query) {
      const std::vector<float> q = script_.query(t, dim_);
      std::copy(q.begin(), q.end(), query);
    }
    policy_->end_step(0, cache_, 0);
    const std::span<const int32_t> kept = cache_.positions(0, 0, 0);
    return {kept.begin(), kept.end()};
  }

  KvCache& cache() { return cache_; }
  EvictionPolicy& policy() { return *policy_; }

 private:
  void append(int32_t pos) {
    const std::vector<uint16_t> k = script_.key(pos, dim_), v = row_of(pos, 1000.0f, dim_);
    cache_.append(0, 0, 0, pos, k.data(), v.data());
  }
  int dim_;
  Script script_;
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

// The default lead (16) is capped at W = 4: rows are requested at the
// eviction step before. One row per request (fetch 1), so the bytes show
// that rows travel, not blocks.
TEST_F(LazyTiersTest, ARecurringTokenIsDemotedThenPromotedBackWithItsExactBytes) {
  Driver driver("lazy+tiers", 16, 4, {{"fetch", "1"}});
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
  // Step 20: its recurrence (last 10 + mri 8 = 18) is due; its row was
  // fetched `lead` steps before, and it is promoted now.
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
  // Scored low again (interval 11 now), it leaves at step 24; its bytes are
  // still in its block, so nothing is demoted: it is a candidate again.
  for (int t = 22; t <= 23; ++t) kept = driver.step();
  const std::set<int32_t> before(kept.begin(), kept.end());
  const TierCounters before_counters = driver.policy().tier_counters();
  kept = driver.step();
  EXPECT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 0);
  const int64_t left = std::count_if(before.begin(), before.end(), [&](int32_t pos) {
    return std::find(kept.begin(), kept.end(), pos) == kept.end();
  });
  ASSERT_GE(left, 2);
  c = driver.policy().tier_counters();
  EXPECT_EQ(c.demoted_slots - before_counters.demoted_slots, left - 1)
      << "every slot that left is demoted but the recurring token, whose block still holds it";
  EXPECT_EQ(c.demoted_bytes - before_counters.demoted_bytes, (left - 1) * kDim * 2 * 2);
  // Its next recurrence (last 21 + mri 11 = 32) is due at step 32: the same
  // row of the same block comes back, with its new statistics.
  for (int t = 25; t <= 31; ++t) kept = driver.step();
  EXPECT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 0);
  kept = driver.step();
  ASSERT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 1);
  const auto again = size_t(std::find(kept.begin(), kept.end(), kRecurring) - kept.begin());
  driver.cache().read_slot(0, 0, 0, int32_t(again), k.data(), v.data());
  EXPECT_EQ(k, row_of(kRecurring, 0.0f));
  EXPECT_EQ(v, row_of(kRecurring, 1000.0f));
  const nlohmann::json state_again = driver.policy().slot_state(0, 0);
  EXPECT_EQ(state_again["last"][again].get<int32_t>(), 21);
  EXPECT_EQ(state_again["mri"][again].get<int32_t>(), 11);
  c = driver.policy().tier_counters();
  EXPECT_EQ(c.promoted_slots, 2);
  EXPECT_GE(c.fetched_blocks, 2);
  EXPECT_EQ(c.fetched_bytes, c.fetched_blocks * 2 * kDim * 2) << "one K and one V row per request, not blocks";
}

// With lead 2 < W the row is requested between eviction steps (at step 14,
// for step 16, whose window [12, 20) holds its recurrence 18), so a token
// evicted at step 12 can come back at the very next eviction step.
TEST_F(LazyTiersTest, RowsRequestedBetweenEvictionStepsComeBackAtTheNextOne) {
  Driver driver("lazy+tiers", 16, 4, {{"lead", "2"}, {"fetch", "1"}});
  std::vector<int32_t> kept;
  for (int t = 1; t <= 15; ++t) kept = driver.step();
  EXPECT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 0);
  EXPECT_EQ(driver.policy().tier_counters().promoted_slots, 0);
  kept = driver.step();
  ASSERT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 1);
  const auto slot = size_t(std::find(kept.begin(), kept.end(), kRecurring) - kept.begin());
  std::vector<uint16_t> k(kDim), v(kDim);
  driver.cache().read_slot(0, 0, 0, int32_t(slot), k.data(), v.data());
  EXPECT_EQ(k, row_of(kRecurring, 0.0f));
  EXPECT_EQ(v, row_of(kRecurring, 1000.0f));
  const TierCounters c = driver.policy().tier_counters();
  EXPECT_EQ(c.promoted_slots, 1);
  EXPECT_EQ(c.fetched_blocks, 1);
  EXPECT_EQ(c.fetched_bytes, 2 * kDim * 2);
}

// The probe alone: the recurring token is hit at steps 2 and 3 only, so its
// scheduled recurrence (4) is long past when it is evicted (step 12) and
// never due again. Its key points along dimension 1, every other key along dimension
// 0. When the query turns to dimension 1 (from step 14 on), the token's
// sketch bound reaches the hit level at the request (step 14, lead 2), its
// fetched key passes the probe at step 16, and it is back; with the query
// never turning, it stays out.
TEST_F(LazyTiersTest, TheProbeBringsBackATokenTheQueryTurnsTo) {
  for (bool turn : {true, false}) {
    SCOPED_TRACE(turn ? "the query turns" : "the query stays");
    Script script;
    script.hit = [](int32_t pos, int32_t t) { return pos != kRecurring || t == 2 || t == 3; };
    script.key = [](int32_t pos, int dim) {
      std::vector<uint16_t> k(static_cast<size_t>(dim), fp32_to_fp16(0.0f));
      k[pos == kRecurring ? 1 : 0] = fp32_to_fp16(pos == kRecurring ? 4.0f : 0.25f);
      return k;
    };
    script.query = [turn](int32_t t, int dim) {
      std::vector<float> q(static_cast<size_t>(dim), 0.0f);
      q[turn && t >= 14 ? 1 : 0] = 4.0f;
      return q;
    };
    Driver driver("lazy+tiers", 16, 4, {{"probe", "1"}, {"lead", "2"}}, kDim, script);
    std::vector<int32_t> kept;
    for (int t = 1; t <= 12; ++t) kept = driver.step();
    ASSERT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 0) << "evicted at step 12";
    EXPECT_GT(driver.policy().tier_counters().demoted_slots, 0);
    for (int t = 13; t <= 15; ++t) kept = driver.step();
    EXPECT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 0);
    kept = driver.step();
    EXPECT_EQ(std::count(kept.begin(), kept.end(), kRecurring), turn ? 1 : 0);
  }
}

// With a head dimension Q8_0 can split, rows travel as Q8_0 (34 bytes per 32
// values) unless q8 = 0, and come back within its quantization step.
TEST_F(LazyTiersTest, RowsTravelAsQ8UnlessAskedForF16) {
  constexpr int kQ8Dim = 32;
  for (const char* q8 : {"1", "0"}) {
    SCOPED_TRACE(std::string("q8=") + q8);
    Driver driver("lazy+tiers", 16, 4, {{"q8", q8}}, kQ8Dim);
    std::vector<int32_t> kept;
    for (int t = 1; t <= 20; ++t) kept = driver.step();
    ASSERT_EQ(std::count(kept.begin(), kept.end(), kRecurring), 1);
    const size_t row_bytes = q8[0] == '1' ? 34 : kQ8Dim * 2;
    const TierCounters c = driver.policy().tier_counters();
    EXPECT_EQ(c.demoted_bytes, c.demoted_slots * int64_t(2 * row_bytes));
    EXPECT_EQ(driver.policy().tier_counters().promoted_bytes, int64_t(2 * row_bytes));
    const auto slot = size_t(std::find(kept.begin(), kept.end(), kRecurring) - kept.begin());
    std::vector<uint16_t> k(kQ8Dim), v(kQ8Dim);
    driver.cache().read_slot(0, 0, 0, int32_t(slot), k.data(), v.data());
    const std::vector<uint16_t> k_sent = row_of(kRecurring, 0.0f, kQ8Dim), v_sent = row_of(kRecurring, 1000.0f, kQ8Dim);
    if (q8[0] == '0') {
      EXPECT_EQ(k, k_sent);
      EXPECT_EQ(v, v_sent);
      continue;
    }
    EXPECT_NE(v, v_sent) << "V near 1000 cannot be exact on the int8 grid";
    for (int d = 0; d < kQ8Dim; ++d) {
      // Half a step of the int8 grid of the row's largest value, plus f16 rounding.
      EXPECT_NEAR(fp16_to_fp32(k[size_t(d)]), fp16_to_fp32(k_sent[size_t(d)]), 6.0f / 127 + 0.01f);
      EXPECT_NEAR(fp16_to_fp32(v[size_t(d)]), fp16_to_fp32(v_sent[size_t(d)]), 1006.0f / 127 * 0.51f + 1.0f);
    }
  }
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
