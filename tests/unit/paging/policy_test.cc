// Contract tests that every replacement policy must pass, plus the
// deterministic orders of follow-prediction and LRU.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "kvstore/paging/replacement_policy.h"
#include "tests/unit/paging/paging_test_util.h"

namespace lazykv::paging {
namespace {

class EveryPolicy : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<ReplacementPolicy> make() { return make_replacement_policy(GetParam(), 7); }
};

TEST_P(EveryPolicy, NameMatchesFactoryName) { EXPECT_EQ(make()->name(), GetParam()); }

TEST_P(EveryPolicy, VictimsAreNeverTheIncomingPage) {
  const auto requests = testing::zipf_requests(3000, 64, 0.9, 3);
  const auto predictions = perfect_predictions(requests);
  auto policy = make();
  bool victim_was_incoming = false;
  const auto size_of = [](PageId page) -> size_t { return page % 4 + 1; };
  const auto steps =
      testing::replay(*policy, requests, predictions, 24, size_of, 5, &victim_was_incoming);
  EXPECT_FALSE(victim_was_incoming);
  EXPECT_GT(testing::count_misses(steps), 0u);
}

TEST_P(EveryPolicy, ContainsSizeAndErase) {
  auto policy = make();
  EXPECT_EQ(policy->size(), 0u);
  for (PageId page : {10, 20, 30}) {
    EXPECT_FALSE(policy->request(page, page, page + 5));
    policy->insert(page);
  }
  EXPECT_EQ(policy->size(), 3u);
  EXPECT_TRUE(policy->contains(20));
  EXPECT_TRUE(policy->request(20, 40, 50));
  policy->erase(20);
  EXPECT_FALSE(policy->contains(20));
  EXPECT_EQ(policy->size(), 2u);
  policy->erase(20);  // not cached: no effect
  policy->erase(99);
  EXPECT_EQ(policy->size(), 2u);
  // An erased page is never chosen as a victim, and comes back as a miss.
  const PageId first = policy->choose_victim(77);
  const PageId second = policy->choose_victim(77);
  EXPECT_NE(first, 20u);
  EXPECT_NE(second, 20u);
  EXPECT_NE(first, second);
  EXPECT_EQ(policy->size(), 0u);
  EXPECT_FALSE(policy->request(20, 41, 60));
}

TEST_P(EveryPolicy, ChooseVictimSkipsACachedIncomingPage) {
  auto policy = make();
  for (PageId page : {1, 2}) {
    EXPECT_FALSE(policy->request(page, page, kNever));
    policy->insert(page);
  }
  // Whatever its order, the policy must not return the page it makes room for.
  EXPECT_EQ(policy->choose_victim(1), 2u);
  EXPECT_THROW(policy->choose_victim(1), Error);
}

TEST_P(EveryPolicy, MisuseThrowsInvalidArgument) {
  auto policy = make();
  EXPECT_THROW(policy->choose_victim(1), Error);
  EXPECT_THROW(policy->insert(5), Error);  // no miss on 5 before
  EXPECT_FALSE(policy->request(5, 0, 3));
  EXPECT_THROW(policy->insert(6), Error);  // the miss was on 5
  policy->insert(5);
  EXPECT_THROW(policy->insert(5), Error);  // already cached
  try {
    policy->insert(8);
    FAIL() << "insert without a miss did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(Paging, EveryPolicy,
                         ::testing::Values("guard", "follow-prediction", "lru"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

TEST(MakeReplacementPolicy, UnknownNameIsInvalidArgument) {
  for (const char* name : {"", "Guard", "belady", "lru "}) {
    try {
      make_replacement_policy(name, 0);
      FAIL() << "'" << name << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("guard"), std::string::npos);
    }
  }
}

void fill(ReplacementPolicy& policy, PageId page, uint64_t now, uint64_t predicted) {
  ASSERT_FALSE(policy.request(page, now, predicted));
  policy.insert(page);
}

TEST(FollowPrediction, EvictsFurthestPredictionAndFollowsUpdates) {
  auto policy = make_follow_prediction();
  fill(*policy, 1, 0, 30);
  fill(*policy, 2, 1, 10);
  fill(*policy, 3, 2, 20);
  EXPECT_EQ(policy->choose_victim(9), 1u);
  EXPECT_TRUE(policy->request(2, 3, 100));  // a hit moves 2 to the far end
  EXPECT_EQ(policy->choose_victim(9), 2u);
  EXPECT_EQ(policy->choose_victim(9), 3u);
}

TEST(FollowPrediction, TiesGoToThePageRequestedLongestAgo) {
  auto policy = make_follow_prediction();
  fill(*policy, 5, 0, kNever);
  fill(*policy, 1, 1, kNever);
  fill(*policy, 3, 2, kNever);
  fill(*policy, 4, 3, 7);
  EXPECT_TRUE(policy->request(5, 4, kNever));  // 5 is now the most recent
  EXPECT_EQ(policy->choose_victim(9), 1u);
  EXPECT_EQ(policy->choose_victim(9), 3u);
  EXPECT_EQ(policy->choose_victim(9), 5u);
  EXPECT_EQ(policy->choose_victim(9), 4u);
}

TEST(Lru, EvictsLeastRecentlyRequestedIgnoringPredictions) {
  auto policy = make_lru();
  fill(*policy, 1, 0, 1);
  fill(*policy, 2, 1, kNever);
  fill(*policy, 3, 2, 3);
  EXPECT_TRUE(policy->request(1, 3, 4));  // order now 2, 3, 1
  EXPECT_EQ(policy->choose_victim(9), 2u);
  fill(*policy, 4, 4, 5);  // order 3, 1, 4
  EXPECT_EQ(policy->choose_victim(9), 3u);
  EXPECT_EQ(policy->choose_victim(9), 1u);
  EXPECT_EQ(policy->choose_victim(9), 4u);
}

TEST(Lru, LoopOneLargerThanTheCacheMissesEverything) {
  const auto requests = testing::looping_requests(500, 9);
  auto policy = make_lru();
  std::vector<uint64_t> predictions(requests.size(), kNever);
  EXPECT_EQ(simulate_misses(*policy, requests, predictions, 8), requests.size());
  // OPT: 9 cold misses (requests 0..8), then one every 8 requests (16, 24, .., 496).
  EXPECT_EQ(belady_misses(requests, 8), 70u);
}

}  // namespace
}  // namespace lazykv::paging
