#include "worker/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>
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

// A donor's full pages of one (layer, head), adopted by another sequence in
// every (layer, head): what a prefix cache does with a prompt computed once.
void adopt_all(KvCache& cache, SeqId donor, SeqId seq, int n_pages) {
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      const auto pages = cache.page_ids(donor, l, h).subspan(0, size_t(n_pages));
      cache.adopt_pages(seq, l, h, pages);
    }
  }
}

// Sequence 1 appends 8 tokens (2 full pages per head); `sharers` adopt them all.
void share_two_pages(KvCache& cache, std::initializer_list<SeqId> sharers) {
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 8);
  for (SeqId s : sharers) {
    cache.add_sequence(s);
    adopt_all(cache, 1, s, 2);
  }
}

TEST(KvCache, AdoptedPagesAreSharedReadAsAppendedAndLiveUntilTheLastHolderGoes) {
  KvCache cache(small_config());
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 10);  // 3 pages per head, 2 of them full
  const size_t donor_bytes = cache.bytes_used();
  cache.add_sequence(2);
  adopt_all(cache, 1, 2, 2);
  EXPECT_EQ(cache.bytes_used(), donor_bytes);  // nothing copied
  EXPECT_EQ(cache.n_slots(2, 1, 1), 8);
  EXPECT_EQ(cache.max_position(2), 7);
  for (int s = 0; s < 8; ++s) {
    EXPECT_EQ(key_at(cache, 2, 1, 1, s), s);
    EXPECT_EQ(value_at(cache, 2, 0, 1, s), 1000 + s);
    EXPECT_EQ(cache.positions(2, 1, 1)[size_t(s)], s);
  }
  const int32_t shared = cache.page_ids(2, 0, 0)[0];
  EXPECT_EQ(cache.page_references(shared), 2);
  cache.remove_sequence(1);  // the donor's last page per head goes; the shared ones stay
  EXPECT_EQ(cache.bytes_used(), 8 * cache.page_bytes());
  EXPECT_EQ(key_at(cache, 2, 1, 1, 5), 5);
  const std::vector<int32_t> held(cache.page_ids(2, 0, 0).begin(), cache.page_ids(2, 0, 0).end());
  cache.retain_pages(held);  // an outside holder (a prefix cache)
  cache.remove_sequence(2);
  EXPECT_EQ(cache.bytes_used(), 2 * cache.page_bytes());
  EXPECT_EQ(cache.page_references(shared), 1);
  cache.release_pages(held);
  EXPECT_EQ(cache.page_references(shared), 0);
  EXPECT_EQ(cache.bytes_used(), 0u);
}

TEST(KvCache, CompactingASharedPageCopiesItFirst) {
  KvCache cache(small_config());
  share_two_pages(cache, {2});
  const size_t before = cache.bytes_used();
  const std::vector<int32_t> keep = {1, 3, 4, 6};  // moves rows into page 0, then page 1 is dropped
  cache.compact(2, 0, 1, keep);
  for (size_t i = 0; i < keep.size(); ++i) {
    EXPECT_EQ(key_at(cache, 2, 0, 1, int(i)), keep[i]);
    EXPECT_EQ(cache.positions(2, 0, 1)[i], keep[i]);
  }
  for (int s = 0; s < 8; ++s) EXPECT_EQ(key_at(cache, 1, 0, 1, s), s);  // the donor's rows are untouched
  EXPECT_EQ(cache.bytes_used(), before + cache.page_bytes());          // one private copy; page 1 stays the donor's
  EXPECT_EQ(cache.page_references(cache.page_ids(1, 0, 1)[1]), 1);
}

TEST(KvCache, AppendingAfterASharedPartialTailCopiesItInReserve) {
  KvCache cache(small_config());
  share_two_pages(cache, {2});
  const std::vector<int32_t> first_six = {0, 1, 2, 3, 4, 5};  // moves nothing: page 1 stays shared, part full
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) cache.compact(2, l, h, first_six);
  }
  const size_t before = cache.bytes_used();
  append_tokens(cache, 2, 100, 1);  // slot 6, in the shared page
  EXPECT_EQ(cache.bytes_used(), before + 4 * cache.page_bytes());  // a private tail per (layer, head)
  EXPECT_EQ(key_at(cache, 2, 1, 0, 6), 100);
  EXPECT_EQ(key_at(cache, 2, 1, 0, 5), 5);
  EXPECT_EQ(key_at(cache, 1, 1, 0, 6), 6);  // the donor still reads its own token 6
  // One head alone (reserve_head), as promotion does.
  cache.add_sequence(3);
  adopt_all(cache, 1, 3, 2);
  cache.compact(3, 0, 0, first_six);
  ASSERT_TRUE(cache.reserve_head(3, 0, 0, 1));
  const auto k = row(200);
  cache.append(3, 0, 0, 200, k.data(), k.data());
  EXPECT_EQ(key_at(cache, 3, 0, 0, 6), 200);
  EXPECT_EQ(key_at(cache, 1, 0, 0, 6), 6);
}

TEST(KvCache, TheCopyOfASharedTailCountsAgainstTheCapacity) {
  KvCache cache(small_config(/*capacity=*/8 * 128));  // 8 pages
  share_two_pages(cache, {2});  // all 8 pages
  const std::vector<int32_t> first_six = {0, 1, 2, 3, 4, 5};
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) cache.compact(2, l, h, first_six);  // moves nothing: every tail shared, part full
  }
  // A 7th slot fits the pages each head has; only the 4 tail copies need memory, and there is none.
  EXPECT_THROW(cache.reserve(2, 1), Error);
  EXPECT_FALSE(cache.reserve_head(2, 0, 0, 1));
  EXPECT_EQ(cache.page_references(cache.page_ids(2, 0, 0)[1]), 2);  // unchanged
  EXPECT_EQ(cache.bytes_used(), cache.capacity_bytes());
  cache.remove_sequence(1);  // now the tails are sequence 2's alone: no copy needed
  cache.reserve(2, 1);
  EXPECT_EQ(cache.bytes_used(), cache.capacity_bytes());
}

TEST(KvCache, ACopyIsRecordedAsWrittenForTheMirrorAndTheSharedPageIsNot) {
  KvCache cache(small_config());
  share_two_pages(cache, {2});
  cache.track_written_pages();
  const int32_t shared = cache.page_ids(2, 0, 0)[0];
  const std::vector<int32_t> keep = {1, 2};
  cache.compact(2, 0, 0, keep);
  std::vector<int32_t> written;
  cache.take_written_pages(written);
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0], cache.page_ids(2, 0, 0)[0]);
  EXPECT_NE(written[0], shared);
}

// A page loaded from its bytes (a prompt block fetched from the tiers) reads
// as the page it was copied from once a sequence adopts it, is recorded as
// written for the mirror, counts against the capacity, and is refused
// (-1, nothing taken) where it does not fit.
TEST(KvCache, ALoadedPageReadsAsItsSourceAndCountsAgainstTheCapacity) {
  KvCache cache(small_config(5 * 4 * 8 * 2 * sizeof(uint16_t)));  // five pages
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 4);  // one full page in each of the four heads
  const int32_t source = cache.page_ids(1, 1, 0)[0];
  const std::vector<uint8_t> bytes(cache.page_data(source), cache.page_data(source) + cache.page_bytes());
  cache.track_written_pages();
  const int32_t loaded = cache.load_page(bytes);
  ASSERT_GE(loaded, 0);
  EXPECT_NE(loaded, source);
  EXPECT_EQ(cache.page_references(loaded), 1);
  std::vector<int32_t> written;
  cache.take_written_pages(written);
  EXPECT_EQ(written, std::vector<int32_t>{loaded});
  EXPECT_EQ(cache.load_page(bytes), -1);  // a sixth page: no room
  EXPECT_EQ(cache.bytes_used(), 5 * cache.page_bytes());
  EXPECT_THROW(cache.load_page(std::span(bytes).first(10)), Error);

  cache.add_sequence(2);
  const std::vector<int32_t> pages = {loaded};
  cache.adopt_pages(2, 0, 1, pages);
  cache.release_pages(pages);  // the sequence holds it now
  for (int slot = 0; slot < 4; ++slot) {
    EXPECT_EQ(key_at(cache, 2, 0, 1, slot), key_at(cache, 1, 1, 0, slot));
    EXPECT_EQ(value_at(cache, 2, 0, 1, slot), value_at(cache, 1, 1, 0, slot));
  }
  cache.remove_sequence(2);
  EXPECT_EQ(cache.bytes_used(), 4 * cache.page_bytes());
}

TEST(KvCache, RetainingAFreePageIsRefusedAndChangesNoCount) {
  KvCache cache(small_config());
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 4);
  const int32_t held = cache.page_ids(1, 0, 0)[0];
  cache.add_sequence(2);
  append_tokens(cache, 2, 0, 4);
  const int32_t freed = cache.page_ids(2, 0, 0)[0];
  cache.remove_sequence(2);
  const std::vector<int32_t> pages = {held, freed};
  EXPECT_THROW(cache.retain_pages(pages), Error);
  EXPECT_EQ(cache.page_references(held), 1);
  EXPECT_EQ(cache.page_references(freed), 0);
}

TEST(KvCache, APageNoLongerSharedIsWrittenInPlace) {
  KvCache cache(small_config());
  share_two_pages(cache, {2});
  cache.remove_sequence(1);
  const size_t before = cache.bytes_used();
  const int32_t page = cache.page_ids(2, 0, 0)[0];
  const std::vector<int32_t> keep = {1, 3};
  cache.compact(2, 0, 0, keep);
  EXPECT_EQ(cache.page_ids(2, 0, 0)[0], page);
  EXPECT_EQ(cache.bytes_used(), before - cache.page_bytes());  // page 1 dropped, nothing copied
}

TEST(KvCache, SharersCompactingAtOnceEachGetACopyAndTheDonorKeepsItsRows) {
  KvCache cache(small_config());
  share_two_pages(cache, {2, 3, 4, 5});
  const std::vector<int32_t> keep = {1, 3, 5, 7};
  std::vector<std::thread> threads;
  for (SeqId s : {2, 3, 4, 5}) {
    threads.emplace_back([&cache, &keep, s] {
      for (int l = 0; l < 2; ++l) {
        for (int h = 0; h < 2; ++h) cache.compact(s, l, h, keep);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (SeqId s : {2, 3, 4, 5}) {
    for (size_t i = 0; i < keep.size(); ++i) EXPECT_EQ(key_at(cache, s, 1, 1, int(i)), keep[i]);
  }
  for (int s = 0; s < 8; ++s) EXPECT_EQ(key_at(cache, 1, 1, 1, s), s);
  // The donor's 8 pages, plus one private page 0 per sharer and head (16), page 1 dropped by each.
  EXPECT_EQ(cache.bytes_used(), (8 + 16) * cache.page_bytes());
  cache.remove_sequence(1);
  for (SeqId s : {2, 3, 4, 5}) cache.remove_sequence(s);
  EXPECT_EQ(cache.bytes_used(), 0u);
}

TEST(KvCache, AWriteIntoASharedPageWithoutReserveIsRefused) {
  KvCache cache(small_config());
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 4);
  cache.add_sequence(2);
  adopt_all(cache, 1, 2, 1);
  const auto k = row(9);
  EXPECT_THROW(cache.write_slot(2, 0, 0, 2, k.data(), k.data()), Error);
  EXPECT_EQ(key_at(cache, 1, 0, 0, 2), 2);
  EXPECT_THROW(cache.adopt_pages(2, 0, 0, cache.page_ids(1, 0, 0)), Error);  // the head holds slots already
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


// What a device mirror of the pool relies on: every page append() or
// compact() writes is reported once, and a copy of just those pages (into a
// mirror that started as a copy of the pool) equals the pool again.
// A mirror that writes new rows itself: pending slots count and carry their
// positions at once, their rows arrive later, and neither is a written page.
TEST(KvCache, PendingSlotsTakeTheirRowsLaterWithoutBeingWritten) {
  KvCache cache(small_config());
  std::vector<int32_t> written;
  cache.add_sequence(1);
  cache.track_written_pages();
  cache.reserve(1, 6);
  for (int t = 0; t < 6; ++t) EXPECT_EQ(cache.append_pending(1, 1, 0, 10 + t), t);
  EXPECT_EQ(cache.n_slots(1, 1, 0), 6);
  EXPECT_EQ(cache.max_position(1), 15);
  for (int t = 0; t < 6; ++t) {
    const auto k = row(uint16_t(100 + t)), v = row(uint16_t(200 + t));
    cache.write_slot(1, 1, 0, t, k.data(), v.data());
  }
  cache.take_written_pages(written);
  EXPECT_TRUE(written.empty()) << "the mirror already holds these rows";
  for (int t = 0; t < 6; ++t) {
    EXPECT_EQ(key_at(cache, 1, 1, 0, t), 100 + t);
    EXPECT_EQ(value_at(cache, 1, 1, 0, t), 200 + t);
  }
  const auto k = row(1);
  EXPECT_THROW(cache.write_slot(1, 1, 0, 6, k.data(), k.data()), Error);  // past the slots
  EXPECT_EQ(cache.append_pending(1, 1, 0, 16), 6);  // two pages of 4 reserved: room for 8
  EXPECT_EQ(cache.append_pending(1, 1, 0, 17), 7);
  EXPECT_THROW(cache.append_pending(1, 1, 0, 18), Error) << "past what reserve made room for";
}

TEST(KvCache, ReportsTheWrittenPagesForAMirror) {
  KvCache cache(small_config());
  std::vector<int32_t> written;
  cache.add_sequence(1);
  append_tokens(cache, 1, 0, 3);  // before tracking: not reported
  cache.take_written_pages(written);
  EXPECT_TRUE(written.empty());

  cache.track_written_pages();
  append_tokens(cache, 1, 3, 6);  // slots 3..8: pages 0, 1, 2 of each head
  cache.take_written_pages(written);
  std::set<int32_t> expected;
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (int32_t p : cache.page_ids(1, l, h)) expected.insert(p);
    }
  }
  EXPECT_EQ(std::set<int32_t>(written.begin(), written.end()), expected);
  EXPECT_EQ(written.size(), expected.size()) << "a page is reported once";
  cache.take_written_pages(written);
  EXPECT_TRUE(written.empty()) << "taking clears the record";

  // The mirror: a byte copy of every page, then only the written ones.
  const size_t page_bytes = cache.page_bytes();
  std::vector<uint8_t> mirror(cache.pool_pages() * page_bytes);
  auto copy_pages = [&](const std::vector<int32_t>& pages) {
    for (int32_t p : pages) std::memcpy(mirror.data() + size_t(p) * page_bytes, cache.page_data(p), page_bytes);
  };
  std::vector<int32_t> all(cache.pool_pages());
  for (size_t p = 0; p < all.size(); ++p) all[p] = int32_t(p);
  copy_pages(all);

  // Compaction of one head rewrites only that head's pages; an append after it too.
  const std::vector<int32_t> keep{0, 4, 5, 8};
  cache.compact(1, 1, 0, keep);
  cache.take_written_pages(written);
  const auto head_pages = cache.page_ids(1, 1, 0);
  ASSERT_FALSE(written.empty());
  for (int32_t p : written) {
    EXPECT_NE(std::find(head_pages.begin(), head_pages.end(), p), head_pages.end()) << "page " << p;
  }
  copy_pages(written);
  append_tokens(cache, 1, 9, 1);
  cache.take_written_pages(written);
  EXPECT_EQ(written.size(), 4u) << "one page per (layer, head)";
  copy_pages(written);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      const cpu::KvPages view = cache.view(1, l, h);
      const auto pages = cache.page_ids(1, l, h);
      for (int32_t s = 0; s < view.n_slots; ++s) {
        const uint8_t* page = mirror.data() + size_t(pages[size_t(s / view.page_slots)]) * page_bytes;
        const auto* keys = reinterpret_cast<const uint16_t*>(page);
        const auto* values = reinterpret_cast<const uint16_t*>(page + cache.values_offset());
        EXPECT_EQ(keys[5 * view.page_slots + s % view.page_slots], key_at(cache, 1, l, h, s));
        EXPECT_EQ(values[(s % view.page_slots) * 8 + 7], value_at(cache, 1, l, h, s));
      }
    }
  }
  EXPECT_EQ(cache.max_position(1), 9);
  // A grown pool's new pages are reported when written.
  const size_t before = cache.pool_pages();
  cache.add_sequence(2);
  while (cache.pool_pages() == before) append_tokens(cache, 2, cache.n_slots(2, 0, 0), 4);
  cache.take_written_pages(written);
  EXPECT_TRUE(std::any_of(written.begin(), written.end(), [&](int32_t p) { return size_t(p) >= before; }));
}

}  // namespace
}  // namespace lazykv
