// A matrix's rows handed out in chunks to whichever thread asks next.
// An equal share per thread left the one that finished first waiting for the
// other (a sibling vCPU busy, a late wake-up): 14% of the main thread's time
// in a 2-thread decode step of the 1.5B model on a Xeon guest. Chunks are
// contiguous and, but for the last, a multiple of 16 rows, so a kernel's
// prefetch and its multi-row tiles work within them as within a share.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace lazykv::cpu {

class RowChunks {
 public:
  // Rows [begin, end) in about kChunksPerThread chunks a thread.
  RowChunks(int64_t begin, int64_t end, int n_threads)
      : end_(end), chunk_(chunk_rows(end - begin, n_threads)), next_(begin) {}

  // The next chunk [begin, end); false once every row is taken.
  bool next(int64_t& begin, int64_t& end) {
    begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= end_) return false;
    end = std::min(end_, begin + chunk_);
    return true;
  }

 private:
  static constexpr int kChunksPerThread = 8;
  static constexpr int64_t kRowMultiple = 16;

  static int64_t chunk_rows(int64_t rows, int n_threads) {
    const int64_t even = rows / (int64_t(std::max(n_threads, 1)) * kChunksPerThread);
    return std::max(kRowMultiple, (even + kRowMultiple - 1) / kRowMultiple * kRowMultiple);
  }

  const int64_t end_, chunk_;
  std::atomic<int64_t> next_;
};

}  // namespace lazykv::cpu
