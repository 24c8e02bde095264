#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "common/fp16.h"
#include "common/thread_pool.h"

namespace lazykv {
namespace {

TEST(ThreadPool, RunsEveryThreadOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(4);
  for (int rep = 0; rep < 100; ++rep) {
    pool.run([&](int i, int n) {
      EXPECT_EQ(n, 4);
      hits[i].fetch_add(1);
    });
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 100);
}

TEST(ThreadPool, ParallelForCoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& s : seen) EXPECT_EQ(s.load(), 1);
  }
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(fp32_to_fp16(f), h) << h;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(5.9604645e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
}

TEST(Bf16, Converts) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_FLOAT_EQ(bf16_to_fp32(0x4049), 3.140625f);
}

TEST(DType, TraitsMatchGgml) {
  EXPECT_EQ(row_bytes(DType::kQ4_1, 64), 40u);
  EXPECT_EQ(row_bytes(DType::kQ6_K, 256), 210u);
  EXPECT_FALSE(dtype_from_id(99).has_value());
  EXPECT_EQ(dtype_from_id(12), DType::kQ4_K);
}

TEST(ErrorCode, HasNames) {
  EXPECT_EQ(error_code_name(ErrorCode::kInvalidModel), "invalid_model");
}

}  // namespace
}  // namespace lazykv

namespace lazykv {
namespace {

TEST(ThreadPool, ExceptionsReachTheCallerAfterEveryThreadFinished) {
  ThreadPool pool(3);
  std::atomic<int> finished{0};
  for (int thrower : {0, 2}) {
    finished = 0;
    EXPECT_THROW(pool.run([&](int i, int) {
      if (i == thrower) throw Error(ErrorCode::kInternal, "boom");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      finished.fetch_add(1);
    }),
                 Error);
    EXPECT_EQ(finished.load(), 2);  // the others ran to completion before run() returned
  }
  // The pool still works afterwards.
  std::atomic<int> hits{0};
  pool.run([&](int, int) { hits.fetch_add(1); });
  EXPECT_EQ(hits.load(), 3);
}

}  // namespace
}  // namespace lazykv
