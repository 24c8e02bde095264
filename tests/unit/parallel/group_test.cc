#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "common/error.h"
#include "parallel_test_util.h"
#include "worker/parallel/group.h"
#include "worker/parallel/group_membership.h"
#include "worker/parallel/model_shard.h"

namespace lazykv {
namespace {

TEST(ShardRange, SplitsContiguouslyWithTheExtraOnTheFirstRanks) {
  EXPECT_EQ(shard_range(3, 0, 2).begin, 0);
  EXPECT_EQ(shard_range(3, 0, 2).end, 2);
  EXPECT_EQ(shard_range(3, 1, 2).begin, 2);
  EXPECT_EQ(shard_range(3, 1, 2).end, 3);
  for (int world = 1; world <= 5; ++world) {
    int64_t next = 0;
    for (int r = 0; r < world; ++r) {
      const ShardRange range = shard_range(11, r, world);
      EXPECT_EQ(range.begin, next);
      EXPECT_GE(range.size(), 11 / world);
      EXPECT_LE(range.size(), 11 / world + 1);
      next = range.end;
    }
    EXPECT_EQ(next, 11);
  }
}

TEST(SoloGroup, IsANoOp) {
  SoloGroup solo;
  float data[2] = {1.5f, -2.0f};
  solo.all_reduce_sum(data, 2);
  EXPECT_EQ(data[0], 1.5f);
  EXPECT_EQ(data[1], -2.0f);
  std::vector<uint8_t> bytes = {1, 2, 3};
  solo.broadcast(bytes, 0);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(solo.world(), 1);
}

class GlooGroupTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooGroupTest, AllReduceSumsAndEveryRankGetsTheSameBits) {
  const int world = GetParam();
  const size_t n = 10007;  // not a multiple of the ring's segments
  std::mutex mutex;
  std::vector<std::vector<float>> results(static_cast<size_t>(world));
  run_ranks(world, [&](TensorParallelGroup& group) {
    ASSERT_EQ(group.world(), world);
    std::vector<float> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = 0.1f * float(i % 97) + float(group.rank() + 1) / 3.0f;
    group.all_reduce_sum(data.data(), n);
    group.all_reduce_sum(data.data(), n);  // twice: the group stays usable
    std::lock_guard<std::mutex> lock(mutex);
    results[size_t(group.rank())] = data;
  });
  for (size_t i = 0; i < n; i += 101) {
    float once = 0;
    for (int r = 0; r < world; ++r) once += 0.1f * float(i % 97) + float(r + 1) / 3.0f;
    EXPECT_NEAR(results[0][i], once * float(world), 1e-3f * std::abs(once * float(world)) + 1e-4f) << i;
  }
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[size_t(r)], results[0]) << "rank " << r;
}

// Larger than any socket buffer (8 Mi floats, 32 MiB): synchronous pairs
// write before they read, so an unsliced sum would block every rank in its
// send until the timeout.
TEST_P(GlooGroupTest, ASumLargerThanTheSocketBuffersCompletes) {
  const int world = GetParam();
  const size_t n = size_t(8) << 20;
  std::mutex mutex;
  std::vector<float> first_values(static_cast<size_t>(world)), last_values(static_cast<size_t>(world));
  run_ranks(
      world,
      [&](TensorParallelGroup& group) {
        std::vector<float> data(n, float(group.rank() + 1));
        group.all_reduce_sum(data.data(), n);
        std::lock_guard<std::mutex> lock(mutex);
        first_values[size_t(group.rank())] = data.front();
        last_values[size_t(group.rank())] = data.back();
      },
      std::chrono::milliseconds(20000));
  const float sum = float(world * (world + 1) / 2);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(first_values[size_t(r)], sum) << "rank " << r;
    EXPECT_EQ(last_values[size_t(r)], sum) << "rank " << r;
  }
}

TEST_P(GlooGroupTest, BroadcastSendsTheRootsBytesWhateverTheirSize) {
  const int world = GetParam();
  std::mutex mutex;
  std::vector<std::vector<uint8_t>> got(static_cast<size_t>(world));
  run_ranks(world, [&](TensorParallelGroup& group) {
    const int root = world - 1;
    std::vector<uint8_t> bytes;
    if (group.rank() == root) {
      for (int i = 0; i < 1000; ++i) bytes.push_back(uint8_t(i * 7));
    } else {
      bytes = {42};
    }
    group.broadcast(bytes, root);
    std::vector<uint8_t> empty;
    if (group.rank() != 0) empty = {9, 9};
    group.broadcast(empty, 0);
    EXPECT_TRUE(empty.empty());
    std::lock_guard<std::mutex> lock(mutex);
    got[size_t(group.rank())] = bytes;
  });
  ASSERT_EQ(got[0].size(), 1000u);
  EXPECT_EQ(got[0][999], uint8_t(999 * 7));
  for (int r = 1; r < world; ++r) EXPECT_EQ(got[size_t(r)], got[0]);
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooGroupTest, ::testing::Values(2, 3));

TEST(GlooGroup, APeerThatLeavesBecomesAnErrorNotAHang) {
  std::atomic<bool> rank0_failed{false};
  std::string message;
  run_ranks(2, [&](TensorParallelGroup& group) {
        float x = 1;
        group.all_reduce_sum(&x, 1);  // both alive
        if (group.rank() == 1) return;  // leaves: its group (and sockets) close
        try {
          std::vector<float> data(1000, 1.0f);
          group.all_reduce_sum(data.data(), data.size());
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
          message = e.what();
          rank0_failed = true;
        }
        // Broken for good: later calls fail at once.
        EXPECT_THROW(group.all_reduce_sum(&x, 1), Error);
      },
      std::chrono::milliseconds(5000));
  EXPECT_TRUE(rank0_failed.load());
  EXPECT_NE(message.find("rank 0 of 2"), std::string::npos) << message;
}

TEST(GlooGroup, ASilentPeerTimesOut) {
  std::atomic<bool> failed{false};
  std::atomic<bool> done{false};
  run_ranks(2, [&](TensorParallelGroup& group) {
        if (group.rank() == 1) {
          // Alive but never joins the collective until rank 0 gave up.
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        float x = 1;
        try {
          group.all_reduce_sum(&x, 1);
        } catch (const Error& e) {
          failed = e.code() == ErrorCode::kUnavailable;
        }
        done = true;
      },
      std::chrono::milliseconds(500));
  EXPECT_TRUE(failed.load());
}

TEST(GlooGroup, RejectsBadOptions) {
  gloo::rendezvous::HashStore store;
  GlooGroupOptions options;
  options.rank = 2;
  options.world = 2;
  EXPECT_THROW(GlooGroup(options, store), Error);
  options.rank = 0;
  options.timeout = std::chrono::milliseconds(0);
  EXPECT_THROW(GlooGroup(options, store), Error);
}

// A rank whose peer never shows up fails its rendezvous within the timeout.
TEST(GlooGroup, ARendezvousWithoutThePeerTimesOut) {
  gloo::rendezvous::HashStore store;
  GlooGroupOptions options;
  options.rank = 0;
  options.world = 2;
  options.timeout = std::chrono::milliseconds(300);
  try {
    GlooGroup group(options, store);
    FAIL() << "a group of two formed with one rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("rendezvous failed"), std::string::npos) << e.what();
  }
}

TEST(GroupMembership, RefusesCollectivesUntilJoinedAndTakesANewGroup) {
  GroupMembership member(0, 2);
  float x = 1;
  try {
    member.all_reduce_sum(&x, 1);
    FAIL() << "a collective ran before the group formed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("not in a group yet"), std::string::npos) << e.what();
  }
  EXPECT_THROW(member.join(std::make_unique<SoloGroup>()), Error) << "a world-1 communicator for a world of 2";
  EXPECT_THROW(GroupMembership(2, 2), Error);
  // Formed twice over Gloo: the second group replaces the first, and each
  // time the sums are right.
  GroupMembership other(1, 2);
  for (int round = 1; round <= 2; ++round) {
    gloo::rendezvous::HashStore store;
    std::thread peer([&] {
      GlooGroupOptions options;
      options.rank = 1;
      options.world = 2;
      other.join(std::make_unique<GlooGroup>(options, store));
    });
    GlooGroupOptions options;
    options.rank = 0;
    options.world = 2;
    member.join(std::make_unique<GlooGroup>(options, store));
    peer.join();
    float a = 1, b = 2;
    std::thread peer_sum([&] { other.all_reduce_sum(&b, 1); });
    member.all_reduce_sum(&a, 1);
    peer_sum.join();
    EXPECT_EQ(a, 3.0f);
    EXPECT_EQ(b, 3.0f);
    EXPECT_EQ(member.joins(), round);
  }
  member.leave();
  EXPECT_FALSE(member.joined());
  EXPECT_THROW(member.all_reduce_sum(&x, 1), Error);
}

}  // namespace
}  // namespace lazykv
