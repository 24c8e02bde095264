#include "kernels/cpu/row_chunks.h"

#include <gtest/gtest.h>

#include <mutex>
#include <utility>
#include <vector>

#include "common/thread_pool.h"

namespace lazykv::cpu {
namespace {

// Every row of [begin, end) is taken once, by whichever thread; chunks are
// contiguous, 16-row multiples that start on the range's 16-row grid.
TEST(RowChunks, EveryRowIsTakenOnceInChunksOfSixteenRows) {
  ThreadPool pool(3);
  for (const auto& range : {std::pair<int64_t, int64_t>{0, 1}, {0, 203}, {5, 1541}, {0, 151936}}) {
    // Named copies: clang before 16 cannot capture structured bindings.
    const int64_t begin = range.first, end = range.second;
    SCOPED_TRACE(std::to_string(begin) + ".." + std::to_string(end));
    RowChunks rows(begin, end, pool.size());
    std::vector<int> taken(size_t(end), 0);
    std::vector<int64_t> sizes;
    std::mutex mutex;
    pool.run([&](int, int) {
      for (int64_t b, e; rows.next(b, e);) {
        std::lock_guard<std::mutex> lock(mutex);
        for (int64_t r = b; r < e; ++r) ++taken[size_t(r)];
        if (e < end) sizes.push_back(e - b);
        EXPECT_EQ((b - begin) % 16, 0) << b;
      }
    });
    for (int64_t r = 0; r < end; ++r) EXPECT_EQ(taken[size_t(r)], r >= begin ? 1 : 0) << "row " << r;
    for (int64_t size : sizes) EXPECT_EQ(size % 16, 0) << size;
    int64_t b = 0, e = 0;
    EXPECT_FALSE(rows.next(b, e)) << "a chunk after the end";
  }
}

// A large matrix is cut into several chunks a thread, so one that falls
// behind can leave its share to the others.
TEST(RowChunks, ALargeMatrixGivesEachThreadSeveralChunks) {
  RowChunks rows(0, 8960, 2);
  int chunks = 0;
  for (int64_t b, e; rows.next(b, e);) ++chunks;
  EXPECT_GE(chunks, 8);
  EXPECT_LE(chunks, 32);
}

}  // namespace
}  // namespace lazykv::cpu
