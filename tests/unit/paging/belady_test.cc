// Belady's optimum, the perfect predictor and the replay loop on worked examples.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "kvstore/paging/replacement_policy.h"
#include "tests/unit/paging/paging_test_util.h"

namespace lazykv::paging {
namespace {

TEST(Belady, TextbookReferenceString) {
  // The classic string of Silberschatz et al.: OPT faults 9 times with 3
  // frames (and LRU 12 times).
  const std::vector<PageId> requests = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1};
  EXPECT_EQ(belady_misses(requests, 3), 9u);
  auto lru = make_lru();
  EXPECT_EQ(simulate_misses(*lru, requests, perfect_predictions(requests), 3), 12u);
  auto follow = make_follow_prediction();
  EXPECT_EQ(simulate_misses(*follow, requests, perfect_predictions(requests), 3), 9u);
}

TEST(Belady, HandWorkedSmallCases) {
  // k = 2 over a b c a b c: miss a, b; c evicts b (a is needed sooner);
  // a hits; b evicts c or a... : a b c a b c -> misses at 0,1,2,4 = 4.
  const std::vector<PageId> abcabc = {1, 2, 3, 1, 2, 3};
  EXPECT_EQ(belady_misses(abcabc, 2), 4u);
  EXPECT_EQ(belady_misses(abcabc, 3), 3u);
  EXPECT_EQ(belady_misses(abcabc, 1), 6u);
  EXPECT_EQ(belady_misses(abcabc, 0), 6u);
  const std::vector<PageId> empty;
  EXPECT_EQ(belady_misses(empty, 4), 0u);
  // k = 1: a miss whenever the page changes.
  const std::vector<PageId> runs = {4, 4, 5, 5, 5, 4, 6, 6};
  EXPECT_EQ(belady_misses(runs, 1), 4u);
  // At least as large as the number of distinct pages; equal when they fit.
  EXPECT_EQ(belady_misses(runs, 3), 3u);
}

TEST(Belady, NeverWorseThanAnyPolicy) {
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const auto requests = testing::zipf_requests(2000, 60, 0.8, seed);
    for (size_t k : {1, 4, 16}) {
      const size_t optimum = belady_misses(requests, k);
      auto lru = make_lru();
      EXPECT_LE(optimum, simulate_misses(*lru, requests, perfect_predictions(requests), k));
      auto follow = make_follow_prediction();
      EXPECT_EQ(optimum, simulate_misses(*follow, requests, perfect_predictions(requests), k));
    }
  }
}

TEST(PerfectPredictions, NextRequestTimeOrNever) {
  const std::vector<PageId> requests = {3, 1, 3, 3, 2, 1};
  const std::vector<uint64_t> expected = {2, 5, 3, kNever, kNever, kNever};
  EXPECT_EQ(perfect_predictions(requests), expected);
}

TEST(SimulateMisses, RejectsMismatchedPredictionsAndHandlesZeroCapacity) {
  const std::vector<PageId> requests = {1, 2, 1};
  const std::vector<uint64_t> too_few = {2};
  auto lru = make_lru();
  EXPECT_THROW(simulate_misses(*lru, requests, too_few, 2), Error);
  EXPECT_EQ(simulate_misses(*lru, requests, perfect_predictions(requests), 0), 3u);
  auto fresh = make_lru();
  EXPECT_EQ(simulate_misses(*fresh, requests, perfect_predictions(requests), 2), 2u);
  EXPECT_EQ(fresh->size(), 2u);
}

}  // namespace
}  // namespace lazykv::paging
