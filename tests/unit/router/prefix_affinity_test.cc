#include "coordinator/router/prefix_affinity.h"

#include <string>

#include <gtest/gtest.h>

namespace lazykv::router {
namespace {

using Clock = PrefixAffinity::Clock;
auto any_replica = [](int) { return true; };

std::string text_of(char fill, size_t bytes) { return std::string(bytes, fill); }

TEST(PrefixKeys, OneKeyPerWholeBlockAndAPartialBlockHasNone) {
  EXPECT_TRUE(prefix_keys("m", text_of('a', kPrefixBlockBytes - 1)).empty());
  EXPECT_EQ(prefix_keys("m", text_of('a', 3 * kPrefixBlockBytes + 10)).size(), 3u);
  EXPECT_EQ(prefix_keys("m", text_of('a', 1000 * kPrefixBlockBytes)).size(), kMaxPrefixBlocks);
}

TEST(PrefixKeys, PromptsShareKeysExactlyUpToTheirFirstDifferentBlock) {
  const std::string shared = text_of('s', 2 * kPrefixBlockBytes);
  const auto a = prefix_keys("m", shared + text_of('a', 2 * kPrefixBlockBytes));
  const auto b = prefix_keys("m", shared + text_of('b', 2 * kPrefixBlockBytes));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  EXPECT_NE(a[3], b[3]);
  // A block equal to an earlier one still gets its own key (the chain carries the position).
  EXPECT_NE(a[0], a[1]);
}

TEST(PrefixKeys, TheModelSeedsTheChain) {
  const std::string text = text_of('x', kPrefixBlockBytes);
  EXPECT_NE(prefix_keys("model-a", text), prefix_keys("model-b", text));
}

TEST(PrefixAffinity, TheLongestKnownPrefixWins) {
  PrefixAffinity table(100, std::chrono::seconds(60));
  const auto now = Clock::now();
  const std::string shared = text_of('s', kPrefixBlockBytes);
  const auto short_keys = prefix_keys("m", shared);
  const auto long_keys = prefix_keys("m", shared + text_of('t', 2 * kPrefixBlockBytes));
  table.record(short_keys, 0, now);
  table.record(long_keys, 1, now);  // also re-records block 0 for replica 1
  const auto match = table.longest(long_keys, now, any_replica);
  EXPECT_EQ(match.replica, 1);
  EXPECT_EQ(match.blocks, 3u);
  EXPECT_EQ(table.longest(prefix_keys("m", text_of('z', kPrefixBlockBytes)), now, any_replica).replica, -1);
}

TEST(PrefixAffinity, AnUnusableReplicaFallsBackToAShorterPrefix) {
  PrefixAffinity table(100, std::chrono::seconds(60));
  const auto now = Clock::now();
  const auto keys = prefix_keys("m", text_of('s', 3 * kPrefixBlockBytes));
  table.record({keys[0]}, 0, now);
  table.record(keys, 1, now);
  table.record({keys[0]}, 0, now);  // block 0 last served by replica 0, blocks 1-2 by replica 1
  const auto match = table.longest(keys, now, [](int r) { return r != 1; });
  EXPECT_EQ(match.replica, 0);
  EXPECT_EQ(match.blocks, 1u);
}

TEST(PrefixAffinity, KeysExpireAfterTheirTtl) {
  PrefixAffinity table(100, std::chrono::seconds(10));
  const auto then = Clock::now();
  const auto keys = prefix_keys("m", text_of('s', kPrefixBlockBytes));
  table.record(keys, 1, then);
  EXPECT_EQ(table.longest(keys, then + std::chrono::seconds(9), any_replica).replica, 1);
  EXPECT_EQ(table.longest(keys, then + std::chrono::seconds(11), any_replica).replica, -1);
}

TEST(PrefixAffinity, TheTableKeepsItsCapacityDroppingTheLeastRecent) {
  PrefixAffinity table(2, std::chrono::seconds(60));
  const auto now = Clock::now();
  const auto a = prefix_keys("m", text_of('a', kPrefixBlockBytes));
  const auto b = prefix_keys("m", text_of('b', kPrefixBlockBytes));
  const auto c = prefix_keys("m", text_of('c', kPrefixBlockBytes));
  table.record(a, 0, now);
  table.record(b, 1, now);
  table.record(a, 0, now);  // a is now the most recent
  table.record(c, 1, now);  // drops b
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(table.longest(a, now, any_replica).replica, 0);
  EXPECT_EQ(table.longest(b, now, any_replica).replica, -1);
  EXPECT_EQ(table.longest(c, now, any_replica).replica, 1);
}

}  // namespace
}  // namespace lazykv::router
