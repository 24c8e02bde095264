#include "kvstore/host_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "common/error.h"

namespace lazykv::kvstore {
namespace {

constexpr uint64_t kUnit = 4096;

void expect_error(ErrorCode code, auto&& fn) {
  try {
    fn();
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

TEST(HostPool, RejectsBadCapacity) {
  expect_error(ErrorCode::kInvalidArgument, [] { HostPool pool(0, kUnit); });
  expect_error(ErrorCode::kInvalidArgument, [] { HostPool pool(kUnit * 3 + 1, kUnit); });
  expect_error(ErrorCode::kInvalidArgument, [] { HostPool pool(kUnit, 0); });
}

TEST(HostPool, StartsEmptyWithOneFreeRun) {
  HostPool pool(16 * kUnit, kUnit);
  const HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.capacity_bytes, 16 * kUnit);
  EXPECT_EQ(stats.used_bytes, 0u);
  EXPECT_EQ(stats.largest_free_bytes, 16 * kUnit);
  EXPECT_EQ(stats.fragmentation, 0.0);
  EXPECT_EQ(stats.blocks, 0u);
  EXPECT_EQ(pool.arena().size(), 16 * kUnit);
}

TEST(HostPool, AllocatesFirstFitInUnits) {
  HostPool pool(16 * kUnit, kUnit);
  EXPECT_EQ(pool.allocate(1), 0u);                 // rounds up to one unit
  EXPECT_EQ(pool.allocate(kUnit), kUnit);
  EXPECT_EQ(pool.allocate(kUnit + 1), 2 * kUnit);  // two units
  EXPECT_EQ(pool.allocate(3 * kUnit), 4 * kUnit);
  const HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.used_bytes, 7 * kUnit);
  EXPECT_EQ(stats.blocks, 4u);
  EXPECT_EQ(stats.largest_free_bytes, 9 * kUnit);
}

TEST(HostPool, ArenaIsWritableAndBlocksAreDisjoint) {
  HostPool pool(8 * kUnit, kUnit);
  const uint64_t a = *pool.allocate(2 * kUnit);
  const uint64_t b = *pool.allocate(2 * kUnit);
  std::memset(pool.at(a), 0xaa, 2 * kUnit);
  std::memset(pool.at(b), 0xbb, 2 * kUnit);
  EXPECT_EQ(pool.at(a)[2 * kUnit - 1], 0xaa);
  EXPECT_EQ(pool.at(b)[0], 0xbb);
  EXPECT_EQ(pool.at(a), pool.arena().data() + a);
}

TEST(HostPool, ReusesFreedSpaceFirstFit) {
  HostPool pool(8 * kUnit, kUnit);
  const uint64_t a = *pool.allocate(2 * kUnit);
  const uint64_t b = *pool.allocate(2 * kUnit);
  (void)*pool.allocate(2 * kUnit);
  pool.free(a);
  // The hole at 0 is first and fits one unit; the tail (2 units) is later.
  EXPECT_EQ(pool.allocate(kUnit), 0u);
  EXPECT_EQ(pool.allocate(kUnit), kUnit);
  // No more room in front: a 2-unit request goes to the tail.
  EXPECT_EQ(pool.allocate(2 * kUnit), 6 * kUnit);
  EXPECT_EQ(pool.allocate(1), std::nullopt);
  pool.free(b);
  EXPECT_EQ(pool.allocate(2 * kUnit), b);
}

TEST(HostPool, CoalescesWithBothNeighbours) {
  HostPool pool(6 * kUnit, kUnit);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(*pool.allocate(kUnit));
  // Free 1 and 3, then 2 bridges them into one 3-unit run.
  pool.free(blocks[1]);
  pool.free(blocks[3]);
  EXPECT_EQ(pool.stats().largest_free_bytes, kUnit);
  pool.free(blocks[2]);
  EXPECT_EQ(pool.stats().largest_free_bytes, 3 * kUnit);
  EXPECT_EQ(pool.allocate(3 * kUnit), kUnit);
  EXPECT_EQ(pool.allocate(1), std::nullopt);
  // Free everything: one run of the whole capacity again.
  pool.free(kUnit);
  pool.free(blocks[0]);
  pool.free(blocks[5]);
  pool.free(blocks[4]);
  const HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.largest_free_bytes, 6 * kUnit);
  EXPECT_EQ(stats.used_bytes, 0u);
  EXPECT_EQ(stats.blocks, 0u);
  EXPECT_EQ(pool.allocate(6 * kUnit), 0u);
}

TEST(HostPool, ExhaustionReturnsNullopt) {
  HostPool pool(4 * kUnit, kUnit);
  EXPECT_EQ(pool.allocate(5 * kUnit), std::nullopt);
  EXPECT_EQ(pool.allocate(UINT64_MAX), std::nullopt);  // no overflow in the round-up
  EXPECT_EQ(pool.allocate(4 * kUnit), 0u);
  EXPECT_EQ(pool.allocate(1), std::nullopt);
  EXPECT_EQ(pool.stats().fragmentation, 0.0);  // nothing free
  EXPECT_EQ(pool.stats().largest_free_bytes, 0u);
}

TEST(HostPool, ZeroBytesIsInvalid) {
  HostPool pool(4 * kUnit, kUnit);
  expect_error(ErrorCode::kInvalidArgument, [&] { (void)pool.allocate(0); });
}

TEST(HostPool, FragmentationOnAHandBuiltPattern) {
  HostPool pool(10 * kUnit, kUnit);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(*pool.allocate(kUnit));
  // Free runs: {0}, {2,3}, {6,7,8,9}: free = 7 units, largest = 4.
  for (int i : {0, 2, 3, 6, 7, 8, 9}) pool.free(blocks[i]);
  HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.used_bytes, 3 * kUnit);
  EXPECT_EQ(stats.largest_free_bytes, 4 * kUnit);
  EXPECT_DOUBLE_EQ(stats.fragmentation, 1.0 - 4.0 / 7.0);
  // Filling the largest run leaves {0}, {2,3}: free = 3, largest = 2.
  EXPECT_EQ(pool.allocate(4 * kUnit), 6 * kUnit);
  stats = pool.stats();
  EXPECT_DOUBLE_EQ(stats.fragmentation, 1.0 - 2.0 / 3.0);
}

TEST(HostPool, DoubleFreeAndBadOffsetAreInternalErrors) {
  HostPool pool(4 * kUnit, kUnit);
  const uint64_t a = *pool.allocate(2 * kUnit);
  expect_error(ErrorCode::kInternal, [&] { pool.free(a + kUnit); });  // inside a block
  expect_error(ErrorCode::kInternal, [&] { pool.free(3 * kUnit); });  // in free space
  expect_error(ErrorCode::kInternal, [&] { pool.free(100 * kUnit); });  // past the arena
  pool.free(a);
  expect_error(ErrorCode::kInternal, [&] { pool.free(a); });
  // The failed frees changed nothing.
  EXPECT_EQ(pool.stats().used_bytes, 0u);
  EXPECT_EQ(pool.stats().largest_free_bytes, 4 * kUnit);
}

// Random allocations and frees, checked after every step against a model
// that knows only the live blocks: they never overlap, stay inside the
// arena, and the pool's counts agree with the model's.
TEST(HostPool, RandomWorkloadMatchesModel) {
  constexpr uint64_t kUnits = 256;
  HostPool pool(kUnits * kUnit, kUnit);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded length
  std::mt19937_64 rng(42);
  size_t failed_allocations = 0;
  for (int step = 0; step < 4000; ++step) {
    const bool do_allocate = live.empty() || rng() % 100 < 55;
    if (do_allocate) {
      const uint64_t bytes = 1 + rng() % (12 * kUnit);
      const uint64_t rounded = (bytes + kUnit - 1) / kUnit * kUnit;
      const auto offset = pool.allocate(bytes);
      if (!offset) {
        ++failed_allocations;
        // First fit fails only if no free run is large enough.
        EXPECT_LT(pool.stats().largest_free_bytes, rounded);
        continue;
      }
      ASSERT_EQ(*offset % kUnit, 0u);
      ASSERT_LE(*offset + rounded, kUnits * kUnit);
      const auto after = live.lower_bound(*offset);
      if (after != live.end()) {
        ASSERT_LE(*offset + rounded, after->first) << "overlaps the next block";
      }
      if (after != live.begin()) {
        const auto before = std::prev(after);
        ASSERT_LE(before->first + before->second, *offset) << "overlaps the previous block";
      }
      live.emplace(*offset, rounded);
    } else {
      auto victim = live.begin();
      std::advance(victim, static_cast<long>(rng() % live.size()));
      pool.free(victim->first);
      live.erase(victim);
    }
    uint64_t used = 0;
    for (const auto& [offset, length] : live) used += length;
    const HostPoolStats stats = pool.stats();
    ASSERT_EQ(stats.used_bytes, used);
    ASSERT_EQ(stats.blocks, live.size());
    ASSERT_LE(stats.largest_free_bytes, kUnits * kUnit - used);
  }
  EXPECT_GT(failed_allocations, 0u);  // the workload did reach exhaustion
  for (const auto& [offset, length] : live) pool.free(offset);
  EXPECT_EQ(pool.stats().largest_free_bytes, kUnits * kUnit);  // coalesced back to one run
}

}  // namespace
}  // namespace lazykv::kvstore
