#include "coordinator/http/handler_pool.h"

#include <gtest/gtest.h>

#include <atomic>

#include "tests/unit/http/http_test_client.h"

namespace lazykv::http {
namespace {

using testing::wait_until;

TEST(HandlerPoolTest, ThreadsGrowToTheMaximumThenTasksWait) {
  HandlerPool pool(2);
  std::atomic<int> running{0}, done{0};
  std::atomic<bool> release{false};
  for (int i = 0; i < 5; ++i) {
    pool.submit([&] {
      ++running;
      wait_until([&] { return release.load(); });
      ++done;
    });
  }
  ASSERT_TRUE(wait_until([&] { return running.load() == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(running.load(), 2);  // three wait for a thread
  EXPECT_EQ(pool.threads(), 2);
  release = true;
  EXPECT_TRUE(wait_until([&] { return done.load() == 5; }));
}

TEST(HandlerPoolTest, IdleThreadsEndAndNewOnesStart) {
  HandlerPool pool(4, std::chrono::milliseconds(50));
  std::atomic<int> done{0};
  for (int i = 0; i < 4; ++i) {
    pool.submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++done;
    });
  }
  ASSERT_TRUE(wait_until([&] { return done.load() == 4; }));
  EXPECT_TRUE(wait_until([&] { return pool.threads() == 0; }));
  pool.submit([&] { ++done; });
  EXPECT_TRUE(wait_until([&] { return done.load() == 5; }));
}

TEST(HandlerPoolTest, JoinRunsWhatIsQueuedThenRefusesMore) {
  std::atomic<int> done{0};
  HandlerPool pool(1);
  for (int i = 0; i < 3; ++i) pool.submit([&] { ++done; });
  pool.join();
  EXPECT_EQ(done.load(), 3);
  pool.submit([&] { ++done; });
  EXPECT_EQ(done.load(), 3);
  EXPECT_EQ(pool.threads(), 0);
}

}  // namespace
}  // namespace lazykv::http
