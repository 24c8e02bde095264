#include "coordinator/router/replica_set.h"

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace lazykv::router {
namespace {

using namespace std::chrono_literals;
using Clock = ReplicaSet::Clock;

ReplicaSetOptions options_with(int max_requests, std::chrono::milliseconds affinity_wait = 0ms,
                               int64_t slack_tokens = 1000) {
  ReplicaSetOptions o;
  o.max_requests = max_requests;
  o.affinity_wait = affinity_wait;
  o.affinity_slack_tokens = slack_tokens;
  return o;
}

RouteRequest request_of(char prompt, int64_t tokens) {
  return {prefix_keys("m", std::string(2 * kPrefixBlockBytes, prompt)), tokens, {}};
}

// Waits (up to 10 s) until `n` requests wait in `set`: a request's thread has
// queued it, so what follows happens while it waits.
bool waiting_becomes(const ReplicaSet& set, size_t n) {
  const auto deadline = Clock::now() + 10s;
  while (set.waiting() != n) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// The replica a request gets at once (-1 when it would have to wait).
int acquire_now(ReplicaSet& set, const RouteRequest& r) {
  const auto got = set.acquire(r, Clock::now(), nullptr);
  return got.assignment ? got.assignment->replica : -1;
}

TEST(ReplicaSet, NothingIsSentBeforeAReplicaIsUp) {
  ReplicaSet set({"a", "b"}, options_with(4));
  const auto got = set.acquire(request_of('x', 10), Clock::now() + 1s, nullptr);
  ASSERT_FALSE(got.assignment);
  EXPECT_EQ(got.failure, AcquireFailure::kNoReplicaUp);
}

TEST(ReplicaSet, WithoutAffinityTheLeastLoadedReplicaGetsTheRequest) {
  ReplicaSet set({"a", "b"}, options_with(4));
  set.set_up(0, true);
  set.set_up(1, true);
  const int first = acquire_now(set, request_of('x', 500));
  const int second = acquire_now(set, request_of('y', 100));
  EXPECT_NE(first, second);
  // Now the replica of the 100-token request is the lighter one.
  EXPECT_EQ(acquire_now(set, request_of('z', 10)), second);
  const auto state = set.snapshot();
  EXPECT_EQ(state[size_t(first)].outstanding_tokens, 500);
  EXPECT_EQ(state[size_t(second)].outstanding_tokens, 110);
  EXPECT_EQ(state[size_t(second)].in_flight, 2);
}

TEST(ReplicaSet, APromptGoesWhereItsPrefixWasServedWithinTheSlack) {
  ReplicaSet set({"a", "b"}, options_with(4, 0ms, /*slack_tokens=*/1000));
  set.set_up(0, true);
  set.set_up(1, true);
  const int home = acquire_now(set, request_of('p', 600));
  // Heavier by 600 tokens, within the slack: the prompt returns to its replica.
  const auto again = set.acquire(request_of('p', 10), Clock::now(), nullptr);
  ASSERT_TRUE(again.assignment);
  EXPECT_EQ(again.assignment->replica, home);
  EXPECT_EQ(again.assignment->matched_blocks, 2u);
}

TEST(ReplicaSet, PastTheSlackTheLeastLoadedReplicaWins) {
  ReplicaSet set({"a", "b"}, options_with(8, 0ms, /*slack_tokens=*/100));
  set.set_up(0, true);
  set.set_up(1, true);
  const int home = acquire_now(set, request_of('p', 1000));
  const auto again = set.acquire(request_of('p', 10), Clock::now(), nullptr);
  ASSERT_TRUE(again.assignment);
  EXPECT_EQ(again.assignment->replica, 1 - home);
  EXPECT_EQ(again.assignment->matched_blocks, 0u);
}

TEST(ReplicaSet, AFullAffinityReplicaIsWaitedForOnlyUpToAffinityWait) {
  ReplicaSet set({"a", "b"}, options_with(1, /*affinity_wait=*/150ms, /*slack_tokens=*/1'000'000));
  set.set_up(0, true);
  set.set_up(1, true);
  const int home = acquire_now(set, request_of('p', 10));
  const auto start = Clock::now();
  const auto got = set.acquire(request_of('p', 10), start + 5s, nullptr);
  ASSERT_TRUE(got.assignment);
  EXPECT_EQ(got.assignment->replica, 1 - home);
  EXPECT_GE(Clock::now() - start, 150ms);
}

TEST(ReplicaSet, ASpillOverDoesNotMoveThePrefixHome) {
  ReplicaSet set({"a", "b"}, options_with(1, /*affinity_wait=*/0ms, /*slack_tokens=*/1'000'000));
  set.set_up(0, true);
  set.set_up(1, true);
  const int home = acquire_now(set, request_of('p', 10));
  ASSERT_EQ(acquire_now(set, request_of('p', 10)), 1 - home);  // home is full: spills over
  set.release(home, 10);
  set.release(1 - home, 10);
  const auto next = set.acquire(request_of('p', 10), Clock::now(), nullptr);
  ASSERT_TRUE(next.assignment);
  EXPECT_EQ(next.assignment->replica, home);
  EXPECT_GT(next.assignment->matched_blocks, 0u);
}

TEST(ReplicaSet, AFreedSlotGoesFirstToARequestWhoseHomeItIs) {
  ReplicaSet set({"a", "b"}, options_with(1, /*affinity_wait=*/10s, /*slack_tokens=*/1'000'000));
  set.set_up(0, true);
  set.set_up(1, true);
  const int p_home = acquire_now(set, request_of('p', 10));
  const int q_home = acquire_now(set, request_of('q', 10));
  ASSERT_EQ(q_home, 1 - p_home);
  // Both full. A request with no home waits first, then one whose home is p's replica.
  auto stranger = std::async(std::launch::async, [&] { return set.acquire(request_of('s', 10), Clock::now() + 20s, nullptr); });
  ASSERT_TRUE(waiting_becomes(set, 1));
  auto at_home = std::async(std::launch::async, [&] { return set.acquire(request_of('p', 10), Clock::now() + 20s, nullptr); });
  ASSERT_TRUE(waiting_becomes(set, 2));
  set.release(p_home, 10);
  const auto got = at_home.get();
  ASSERT_TRUE(got.assignment);
  EXPECT_EQ(got.assignment->replica, p_home);
  EXPECT_EQ(set.waiting(), 1u);  // the stranger still waits
  set.release(q_home, 10);
  const auto stranger_got = stranger.get();
  ASSERT_TRUE(stranger_got.assignment);
  EXPECT_EQ(stranger_got.assignment->replica, q_home);
}

TEST(ReplicaSet, ARequestWithoutAPrefixIsNotPassedOverPastAffinityWait) {
  ReplicaSet set({"a", "b"}, options_with(1, /*affinity_wait=*/100ms, /*slack_tokens=*/1'000'000));
  set.set_up(0, true);
  set.set_up(1, true);
  const int p_home = acquire_now(set, request_of('p', 10));
  ASSERT_EQ(acquire_now(set, request_of('q', 10)), 1 - p_home);
  auto stranger = std::async(std::launch::async, [&] { return set.acquire(request_of('s', 10), Clock::now() + 20s, nullptr); });
  ASSERT_TRUE(waiting_becomes(set, 1));
  std::this_thread::sleep_for(150ms);  // past affinity_wait: the stranger's turn comes before later arrivals
  auto at_home = std::async(std::launch::async, [&] { return set.acquire(request_of('p', 10), Clock::now() + 20s, nullptr); });
  ASSERT_TRUE(waiting_becomes(set, 2));
  set.release(p_home, 10);
  const auto stranger_got = stranger.get();
  ASSERT_TRUE(stranger_got.assignment);
  EXPECT_EQ(stranger_got.assignment->replica, p_home);
  set.release(1 - p_home, 10);
  EXPECT_TRUE(at_home.get().assignment);  // then it spills over (its hold-out ran out too)
}

TEST(ReplicaSet, AFreedSlotGoesToTheWaitingRequest) {
  ReplicaSet set({"a"}, options_with(1));
  set.set_up(0, true);
  ASSERT_EQ(acquire_now(set, request_of('x', 10)), 0);
  auto waiter = std::async(std::launch::async, [&] { return set.acquire(request_of('y', 20), Clock::now() + 10s, nullptr); });
  ASSERT_TRUE(waiting_becomes(set, 1));
  EXPECT_EQ(set.waiting(), 1u);
  set.release(0, 10);
  const auto got = waiter.get();
  ASSERT_TRUE(got.assignment);
  EXPECT_EQ(got.assignment->replica, 0);
  EXPECT_EQ(set.snapshot()[0].outstanding_tokens, 20);
}

TEST(ReplicaSet, WaitingRequestsMoveToAnotherReplicaWhenTheirsGoesDown) {
  ReplicaSet set({"a", "b"}, options_with(1));
  set.set_up(0, true);
  ASSERT_EQ(acquire_now(set, request_of('x', 10)), 0);
  auto waiter = std::async(std::launch::async, [&] { return set.acquire(request_of('y', 10), Clock::now() + 10s, nullptr); });
  ASSERT_TRUE(waiting_becomes(set, 1));
  set.set_up(1, true);
  set.set_up(0, false);
  const auto got = waiter.get();
  ASSERT_TRUE(got.assignment);
  EXPECT_EQ(got.assignment->replica, 1);
}

TEST(ReplicaSet, WaitingRequestsFailWhenTheLastReplicaGoesDown) {
  ReplicaSet set({"a"}, options_with(1));
  set.set_up(0, true);
  ASSERT_EQ(acquire_now(set, request_of('x', 10)), 0);
  auto waiter = std::async(std::launch::async, [&] { return set.acquire(request_of('y', 10), Clock::now() + 10s, nullptr); });
  ASSERT_TRUE(waiting_becomes(set, 1));
  set.set_up(0, false);
  const auto got = waiter.get();
  ASSERT_FALSE(got.assignment);
  EXPECT_EQ(got.failure, AcquireFailure::kNoReplicaUp);
  EXPECT_EQ(set.waiting(), 0u);
}

TEST(ReplicaSet, ExcludedReplicasAreSkipped) {
  ReplicaSet set({"a", "b"}, options_with(4));
  set.set_up(0, true);
  set.set_up(1, true);
  RouteRequest retry = request_of('x', 10);
  retry.excluded = {0};
  EXPECT_EQ(acquire_now(set, retry), 1);
  retry.excluded = {0, 1};
  const auto got = set.acquire(retry, Clock::now() + 1s, nullptr);
  ASSERT_FALSE(got.assignment);
  EXPECT_EQ(got.failure, AcquireFailure::kEveryReplicaFailed);
  EXPECT_EQ(set.lightest_up({0}), 1);
  EXPECT_EQ(set.lightest_up({0, 1}), -1);
}

TEST(ReplicaSet, AProbeThatBeganBeforeAFailureDoesNotBringTheReplicaBack) {
  ReplicaSet set({"a"}, options_with(1));
  const auto probe_began = Clock::now();
  ASSERT_TRUE(set.set_up(0, true, probe_began));
  std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(set.set_up(0, false));                // a connection failed
  EXPECT_FALSE(set.set_up(0, true, probe_began));  // that probe's 200 came from before the failure
  EXPECT_FALSE(set.any_up());
  EXPECT_TRUE(set.set_up(0, true, Clock::now()));  // a probe begun after it counts
  EXPECT_TRUE(set.any_up());
}

TEST(ReplicaSet, TheQueueBoundAndTheDeadlineAndCancellationEndAWait) {
  ReplicaSetOptions o = options_with(1);
  o.max_waiting = 0;
  ReplicaSet set({"a"}, o);
  set.set_up(0, true);
  EXPECT_EQ(acquire_now(set, request_of('x', 10)), 0);  // a free slot needs no queue
  EXPECT_EQ(set.acquire(request_of('y', 10), Clock::now() + 1s, nullptr).failure, AcquireFailure::kQueueFull);

  ReplicaSet timed({"a"}, options_with(1));
  timed.set_up(0, true);
  ASSERT_EQ(acquire_now(timed, request_of('x', 10)), 0);
  EXPECT_EQ(timed.acquire(request_of('y', 10), Clock::now() + 50ms, nullptr).failure, AcquireFailure::kTimedOut);
  std::atomic<bool> gone{false};
  auto waiter = std::async(std::launch::async, [&] {
    return timed.acquire(request_of('z', 10), Clock::now() + 10s, [&] { return gone.load(); });
  });
  ASSERT_TRUE(waiting_becomes(timed, 1));
  gone = true;
  EXPECT_EQ(waiter.get().failure, AcquireFailure::kCancelled);
  EXPECT_EQ(timed.waiting(), 0u);
}

}  // namespace
}  // namespace lazykv::router
