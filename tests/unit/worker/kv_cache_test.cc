#include "worker/kv_cache.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"

namespace lazykv {
namespace {

KvCacheConfig small_config(size_t capacity = 0) { return {2, 2, 8, 4, capacity}; }

std::vector<uint16_t> row(uint16_t value) { return std::vector<uint16_t>(8, value); }

void append_tokens(KvCache& cache, SeqId seq, int first_pos, int n) {
  cache.reserve(seq, n);
  for (int t = 0; t < n; ++t) {
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        const auto k = row(uint16_t(first_pos + t));
        const auto v = row(uint16_t(1000 + first_pos + t));
        cache.append(seq, l, h, first_pos + t, k.data(), v.data());
      }
    }
  }
}

// Dimension 5 of a slot's key (keys are [head_dim][page_slots] within a page).
uint16_t key_at(const KvCache& cache, SeqId seq, int l, int h, int slot) {
  const cpu::KvPages view = cache.view(seq, l, h);
  return view.keys[slot / view.page_slots][5 * view.page_slots + slot % view.page_slots];
}

uint16_t value_at(const KvCache& cache, SeqId seq, int l, int h, int slot) {
  const cpu::KvPages view = cache.view(seq, l, h);
  return view.values[slot / view.page_slots][(slot % view.page_slots) * 8 + 7];
}

TEST(KvCache, AppendsAcrossPages) {
  KvCache cache(small_config());
  cache.add_sequence(7);
  append_tokens(cache, 7, 0, 10);
  EXPECT_EQ(cache.n_slots(7, 1, 1), 10);
  // 2 layers * 2 heads * ceil(10 / 4) pages.
  EXPECT_EQ(cache.bytes_used(), 12 * cache.page_bytes());
  EXPECT_EQ(cache.page_bytes(), 4u * 8 * 2 * 2);
  for (int s = 0; s < 10; ++s) {
    EXPECT_EQ(key_at(cache, 7, 1, 0, s), s);
    EXPECT_EQ(value_at(cache, 7, 0, 1, s), 1000 + s);
    EXPECT_EQ(cache.positions(7, 0, 0)[size_t(s)], s);
  }
}

TEST(KvCache, CompactsOneHeadInPlaceAndFreesPages) {
  KvCache cache(small_config());
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 10);
  const size_t before = cache.bytes_used();
  const std::vector<int32_t> keep = {0, 3, 9};
  cache.compact(1, 1, 0, keep);
  EXPECT_EQ(cache.n_slots(1, 1, 0), 3);
  EXPECT_EQ(cache.n_slots(1, 1, 1), 10);  // other heads untouched
  EXPECT_EQ(cache.bytes_used(), before - 2 * cache.page_bytes());
  for (size_t i = 0; i < keep.size(); ++i) {
    EXPECT_EQ(key_at(cache, 1, 1, 0, int(i)), keep[i]);
    EXPECT_EQ(value_at(cache, 1, 1, 0, int(i)), 1000 + keep[i]);
    EXPECT_EQ(cache.positions(1, 1, 0)[i], keep[i]);
  }
  // Appending after compaction continues in the same table.
  append_tokens(cache, 1, 10, 1);
  EXPECT_EQ(cache.n_slots(1, 1, 0), 4);
  EXPECT_EQ(key_at(cache, 1, 1, 0, 3), 10);
}

TEST(KvCache, RejectsBadCompactIndices) {
  KvCache cache(small_config());
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 5);
  const std::vector<int32_t> unordered = {2, 1};
  const std::vector<int32_t> out_of_range = {0, 5};
  EXPECT_THROW(cache.compact(1, 0, 0, unordered), Error);
  EXPECT_THROW(cache.compact(1, 0, 0, out_of_range), Error);
}

TEST(KvCache, CapacityIsEnforcedWithoutPartialChange) {
  KvCache cache(small_config(/*capacity=*/8 * 128));  // 8 pages of 4 slots * 8 dims * (K+V) * 2 bytes
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 8);  // 2 pages per head * 4 heads = 8 pages
  EXPECT_EQ(cache.bytes_used(), cache.capacity_bytes());
  try {
    cache.reserve(1, 1);
    FAIL() << "reserve past capacity must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
  }
  EXPECT_EQ(cache.n_slots(1, 0, 0), 8);
  EXPECT_EQ(cache.bytes_used(), cache.capacity_bytes());
  cache.remove_sequence(1);
  EXPECT_EQ(cache.bytes_used(), 0u);
  cache.add_sequence(2);
  append_tokens(cache, 2, 0, 8);  // the freed pages are reused
  EXPECT_EQ(cache.bytes_used(), cache.capacity_bytes());
}

// The pool grows a chunk of 256 pages at a time, keeps what it grew (the
// lazykv_kv_pool_bytes gauge), and hands out pages that read as zeros: the
// chunk was written when it was taken, so it is resident from then on.
TEST(KvCache, ThePoolGrowsByChunksKeepsItsHighWaterMarkAndStartsZeroed) {
  KvCache cache(small_config());
  const size_t chunk = 256 * cache.page_bytes();
  EXPECT_EQ(cache.bytes_reserved(), 0u);
  cache.add_sequence(1);
  cache.reserve(1, 1);  // one page for each of 4 heads
  EXPECT_EQ(cache.bytes_used(), 4 * cache.page_bytes());
  EXPECT_EQ(cache.bytes_reserved(), chunk);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      const cpu::KvPages view = cache.view(1, l, h);
      for (int i = 0; i < 4 * 8; ++i) {
        ASSERT_EQ(view.keys[0][i], 0) << "layer " << l << ", head " << h;
        ASSERT_EQ(view.values[0][i], 0) << "layer " << l << ", head " << h;
      }
    }
  }
  cache.reserve(1, 257);  // 65 pages for each of 4 heads: a second chunk
  EXPECT_EQ(cache.bytes_used(), 260 * cache.page_bytes());
  EXPECT_EQ(cache.bytes_reserved(), 2 * chunk);
  cache.remove_sequence(1);
  EXPECT_EQ(cache.bytes_used(), 0u);
  EXPECT_EQ(cache.bytes_reserved(), 2 * chunk);
  cache.add_sequence(2);
  append_tokens(cache, 2, 0, 8);  // reuses freed pages; the pool does not grow
  EXPECT_EQ(cache.bytes_reserved(), 2 * chunk);
}

TEST(KvCache, SequencesAreIsolated) {
  KvCache cache(small_config());
  cache.add_sequence(1);
  cache.add_sequence(2);
  append_tokens(cache, 1, 0, 3);
  append_tokens(cache, 2, 100, 5);
  EXPECT_EQ(cache.n_slots(1, 0, 0), 3);
  EXPECT_EQ(cache.n_slots(2, 0, 0), 5);
  EXPECT_EQ(key_at(cache, 2, 0, 0, 0), 100);
  EXPECT_THROW(cache.add_sequence(1), Error);
  EXPECT_THROW(cache.n_slots(3, 0, 0), Error);
  // Sequence 1 holds 3 slots in a 4-slot page: one more fits, the next needs a reserve().
  cache.append(1, 0, 0, 3, row(0).data(), row(0).data());
  EXPECT_THROW(cache.append(1, 0, 0, 4, row(0).data(), row(0).data()), Error);
}

}  // namespace
}  // namespace lazykv

namespace lazykv {
namespace {

TEST(KvCache, KeysAreSlotContiguousWithinAPageAndSurviveCompaction) {
  KvCache cache(small_config());
  cache.add_sequence(1);
  cache.reserve(1, 3);
  for (int t = 0; t < 3; ++t) {
    std::vector<uint16_t> k(8), v(8);
    for (int d = 0; d < 8; ++d) {
      k[size_t(d)] = uint16_t(100 * t + d);
      v[size_t(d)] = uint16_t(1000 + 100 * t + d);
    }
    cache.append(1, 0, 0, t, k.data(), v.data());
  }
  const std::vector<int32_t> keep = {0, 2};
  cache.compact(1, 0, 0, keep);
  const cpu::KvPages view = cache.view(1, 0, 0);
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(view.keys[0][d * view.page_slots + 0], d);          // slot 0: token 0
    EXPECT_EQ(view.keys[0][d * view.page_slots + 1], 200 + d);    // slot 1: token 2
    EXPECT_EQ(view.values[0][1 * 8 + d], 1200 + d);
  }
}

}  // namespace
}  // namespace lazykv
