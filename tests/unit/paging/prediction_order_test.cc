// The indexed heap behind follow-prediction against a brute-force scan.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>
#include <utility>

#include "kvstore/paging/prediction_order.h"

namespace lazykv::paging {
namespace {

// The furthest page other than `excluded` by scanning every entry.
std::optional<PageId> scan_furthest(const std::map<PageId, std::pair<uint64_t, uint64_t>>& entries,
                                    PageId excluded) {
  std::optional<PageId> best;
  std::pair<uint64_t, uint64_t> best_key{};
  for (const auto& [page, key] : entries) {
    if (page == excluded) continue;
    const bool better = !best || key.first > best_key.first ||
                        (key.first == best_key.first && key.second < best_key.second);
    if (better) {
      best = page;
      best_key = key;
    }
  }
  return best;
}

TEST(PredictionOrder, MatchesBruteForceUnderRandomOperations) {
  std::mt19937_64 rng(11);
  PredictionOrder order;
  std::map<PageId, std::pair<uint64_t, uint64_t>> reference;
  uint64_t seq = 0;
  for (int step = 0; step < 20000; ++step) {
    const PageId page = rng() % 64;
    switch (rng() % 3) {
      case 0:
      case 1: {
        // Few distinct predictions, so ties (and kNever) are common.
        const uint64_t predicted = rng() % 5 == 0 ? kNever : rng() % 16;
        order.set(page, predicted, seq);
        reference[page] = {predicted, seq};
        ++seq;
        break;
      }
      default:
        EXPECT_EQ(order.erase(page), reference.erase(page) == 1);
        break;
    }
    ASSERT_EQ(order.size(), reference.size());
    ASSERT_EQ(order.contains(page), reference.contains(page));
    const PageId excluded = rng() % 2 == 0 ? page : 1000;
    ASSERT_EQ(order.furthest(excluded), scan_furthest(reference, excluded)) << "step " << step;
  }
}

TEST(PredictionOrder, EmptyOrOnlyTheExcludedPageHasNoFurthest) {
  PredictionOrder order;
  EXPECT_EQ(order.furthest(1), std::nullopt);
  order.set(1, 5, 0);
  EXPECT_EQ(order.furthest(1), std::nullopt);
  EXPECT_EQ(order.furthest(2), std::optional<PageId>(1));
}

}  // namespace
}  // namespace lazykv::paging
