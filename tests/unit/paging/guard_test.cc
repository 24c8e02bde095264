// Guard: 1-consistency (step by step equal to follow-prediction under exact
// predictions), robustness under bad predictions, and its phase rule.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

#include "kvstore/paging/replacement_policy.h"
#include "tests/unit/paging/paging_test_util.h"

namespace lazykv::paging {
namespace {

using testing::harmonic;
using testing::replay;
using testing::Step;
using testing::unit_size;

struct Pattern {
  std::string name;
  std::vector<PageId> requests;
};

std::vector<Pattern> patterns_for(size_t k, uint64_t seed) {
  const size_t n = 2500;
  return {
      {"zipf-wide", testing::zipf_requests(n, 4 * k + 8, 0.8, seed)},
      {"zipf-skewed", testing::zipf_requests(n, 200, 1.2, seed + 1)},
      {"loop-k+1", testing::looping_requests(n, k + 1)},
      {"loop-2k", testing::looping_requests(n, 2 * k + 1)},
      {"uniform", testing::uniform_requests(n, 2 * k + 3, seed + 2)},
      {"shifting", testing::shifting_loops(n, k + k / 2 + 2, 300, seed + 3)},
  };
}

TEST(Guard, OneConsistentStepByStepWithFollowPredictionAndBelady) {
  for (size_t k : {1, 2, 3, 5, 8, 16, 33, 64}) {
    for (const Pattern& pattern : patterns_for(k, 17 * k)) {
      const auto predictions = perfect_predictions(pattern.requests);
      auto follow = make_follow_prediction();
      const auto expected = replay(*follow, pattern.requests, predictions, k, unit_size);
      const size_t optimum = belady_misses(pattern.requests, k);
      ASSERT_EQ(testing::count_misses(expected), optimum) << pattern.name << " k=" << k;
      for (uint64_t seed : {1, 2, 99}) {
        auto guard = make_guard(seed);
        const auto steps = replay(*guard, pattern.requests, predictions, k, unit_size);
        ASSERT_EQ(steps.size(), expected.size());
        for (size_t i = 0; i < steps.size(); ++i) {
          ASSERT_EQ(steps[i], expected[i]) << pattern.name << " k=" << k << " seed=" << seed
                                           << " diverged at request " << i;
        }
      }
    }
  }
}

TEST(Guard, OneConsistentWithSeveralVictimsPerMissAndErases) {
  // Blocks of 1 to 3 units: a miss may need several victims; some pages are
  // also dropped from outside. Exact predictions: still the same decisions.
  const auto size_of = [](PageId page) -> size_t { return page % 3 + 1; };
  for (size_t capacity : {4, 10, 40}) {
    for (size_t erase_every : {0, 7}) {
      for (const Pattern& pattern : patterns_for(capacity / 2, capacity)) {
        const auto predictions = perfect_predictions(pattern.requests);
        auto follow = make_follow_prediction();
        auto guard = make_guard(capacity + erase_every);
        const auto expected =
            replay(*follow, pattern.requests, predictions, capacity, size_of, erase_every);
        const auto steps =
            replay(*guard, pattern.requests, predictions, capacity, size_of, erase_every);
        ASSERT_EQ(steps, expected) << pattern.name << " capacity=" << capacity
                                   << " erase_every=" << erase_every;
      }
    }
  }
}

// Predictions built to mislead follow-prediction.
enum class BadPrediction { kOlderLooksFurther, kReversed, kRandom };

std::vector<uint64_t> bad_predictions(std::span<const PageId> requests, BadPrediction kind,
                                      uint64_t seed) {
  const uint64_t n = requests.size();
  const auto exact = perfect_predictions(requests);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> predicted(n);
  for (uint64_t i = 0; i < n; ++i) {
    switch (kind) {
      case BadPrediction::kOlderLooksFurther:  // follow-prediction becomes LRU
        predicted[i] = 4 * n - i;
        break;
      case BadPrediction::kReversed:  // the soonest reuse looks furthest
        predicted[i] = exact[i] == kNever ? i + 1 : i + (n + 1 - (exact[i] - i));
        break;
      case BadPrediction::kRandom:
        predicted[i] = i + 1 + rng() % n;
        break;
    }
  }
  return predicted;
}

TEST(Guard, RobustWhereFollowPredictionIsNot) {
  // Bound checked: misses <= (2·H(k−1)+2)·OPT + k. The theorem bounds the
  // expectation up to an additive constant; k (one cache fill) is the
  // constant allowed here, and every seed is checked, not the mean.
  bool follow_prediction_broke_the_bound = false;
  for (size_t k : {8, 16, 32}) {
    const double ratio = 2 * harmonic(k - 1) + 2;
    const size_t n = 6000;
    const std::vector<Pattern> sequences = {
        {"cycle-k+1", testing::looping_requests(n, k + 1)},
        {"loop-2k", testing::looping_requests(n, 2 * k)},
        {"zipf", testing::zipf_requests(n, 4 * k, 0.9, k)},
        {"uniform", testing::uniform_requests(n, 2 * k, k + 1)},
        {"shifting", testing::shifting_loops(n, 2 * k, 500, k + 2)},
    };
    for (const Pattern& sequence : sequences) {
      const size_t optimum = belady_misses(sequence.requests, k);
      const double bound = ratio * static_cast<double>(optimum) + static_cast<double>(k);
      for (auto kind :
           {BadPrediction::kOlderLooksFurther, BadPrediction::kReversed, BadPrediction::kRandom}) {
        const auto predicted = bad_predictions(sequence.requests, kind, k * 31);
        for (uint64_t seed : {1, 2, 3}) {
          auto guard = make_guard(seed);
          const size_t misses = simulate_misses(*guard, sequence.requests, predicted, k);
          EXPECT_LE(static_cast<double>(misses), bound)
              << sequence.name << " k=" << k << " predictions=" << static_cast<int>(kind)
              << " seed=" << seed << " OPT=" << optimum;
        }
        auto follow = make_follow_prediction();
        const size_t follow_misses = simulate_misses(*follow, sequence.requests, predicted, k);
        if (static_cast<double>(follow_misses) > bound) follow_prediction_broke_the_bound = true;
      }
    }
  }
  // The check above can fail: unguarded, the same predictions break it.
  EXPECT_TRUE(follow_prediction_broke_the_bound);
}

TEST(Guard, CycleWithMisleadingPredictionsFollowPredictionMissesEverything) {
  const size_t k = 16;
  const auto requests = testing::looping_requests(17 * 40, k + 1);
  const auto predicted = bad_predictions(requests, BadPrediction::kOlderLooksFurther, 0);
  auto follow = make_follow_prediction();
  EXPECT_EQ(simulate_misses(*follow, requests, predicted, k), requests.size());
  auto guard = make_guard(5);
  EXPECT_LT(simulate_misses(*guard, requests, predicted, k), requests.size() / 2);
}

// Inserts `page` after a miss, evicting first if the cache holds k pages.
PageId miss_and_fill(ReplacementPolicy& policy, PageId page, uint64_t now, uint64_t predicted,
                     size_t k) {
  EXPECT_FALSE(policy.request(page, now, predicted));
  PageId victim = kNever;
  if (policy.size() >= k) victim = policy.choose_victim(page);
  policy.insert(page);
  return victim;
}

TEST(Guard, ErrorEvictsAnUnrequestedOldPageAndGuardsTheReturningPage) {
  const size_t k = 3;
  const PageId a = 1, b = 2, c = 3, d = 4, e = 5, f = 6;
  std::set<PageId> random_victims;
  for (uint64_t seed = 0; seed < 32; ++seed) {
    auto guard = make_guard(seed);
    miss_and_fill(*guard, a, 0, 100, k);
    miss_and_fill(*guard, b, 1, 50, k);
    miss_and_fill(*guard, c, 2, 60, k);
    // Phase 1 starts ({a, b, c} old, unrequested); a is predicted furthest.
    EXPECT_EQ(miss_and_fill(*guard, d, 3, 1000, k), a);
    // a returns long before predicted: an error. The victim is drawn from
    // the unrequested old pages {b, c}, not d, though d looks furthest.
    const PageId random_victim = miss_and_fill(*guard, a, 4, 2000, k);
    EXPECT_TRUE(random_victim == b || random_victim == c) << random_victim;
    random_victims.insert(random_victim);
    // a is guarded: follow-prediction evicts d (1000) and not a (2000).
    EXPECT_EQ(miss_and_fill(*guard, e, 5, 10, k), d);
    // The last old page is requested: every cached page is marked.
    const PageId last_old = random_victim == b ? c : b;
    EXPECT_TRUE(guard->request(last_old, 6, 70));
    // The next miss starts phase 2, which lifts the guard on a.
    EXPECT_EQ(miss_and_fill(*guard, f, 7, 80, k), a);
  }
  // The draw depends on the seed: both old pages come up.
  EXPECT_EQ(random_victims, (std::set<PageId>{b, c}));
}

TEST(Guard, FollowPredictionDiffersOnTheSameRequests) {
  auto follow = make_follow_prediction();
  miss_and_fill(*follow, 1, 0, 100, 3);
  miss_and_fill(*follow, 2, 1, 50, 3);
  miss_and_fill(*follow, 3, 2, 60, 3);
  EXPECT_EQ(miss_and_fill(*follow, 4, 3, 1000, 3), 1u);
  EXPECT_EQ(miss_and_fill(*follow, 1, 4, 2000, 3), 4u);  // where Guard draws from {2, 3}
}

TEST(Guard, SameSeedSameDecisions) {
  const auto requests = testing::zipf_requests(3000, 100, 0.9, 7);
  const auto predicted = bad_predictions(requests, BadPrediction::kRandom, 8);
  auto first = make_guard(42);
  auto second = make_guard(42);
  const auto a = replay(*first, requests, predicted, 10, unit_size);
  const auto b = replay(*second, requests, predicted, 10, unit_size);
  EXPECT_EQ(a, b);
  auto other = make_guard(43);
  EXPECT_NE(replay(*other, requests, predicted, 10, unit_size), a);
}

}  // namespace
}  // namespace lazykv::paging
