#include "worker/prefix_cache.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"

namespace lazykv {
namespace {

// 2 layers, 2 KV heads, head_dim 8, 4-slot pages: a block is 4 tokens.
KvCacheConfig small_config(size_t capacity = 0) { return {2, 2, 8, 4, capacity}; }
constexpr uint64_t kFingerprint = 42;

// Appends `prompt` to a new sequence as a prefill would: token t's K row is
// all t + 100 * id (so two prompts' rows differ), its position t.
void prefill(KvCache& cache, SeqId seq, const std::vector<int32_t>& prompt) {
  cache.add_sequence(seq);
  cache.reserve(seq, int(prompt.size()));
  for (size_t t = 0; t < prompt.size(); ++t) {
    const std::vector<uint16_t> k(8, uint16_t(prompt[t] + 100 * seq)), v(8, uint16_t(t));
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) cache.append(seq, l, h, int32_t(t), k.data(), v.data());
    }
  }
}

uint16_t key_of_slot(const KvCache& cache, SeqId seq, int l, int h, int slot) {
  const cpu::KvPages view = cache.view(seq, l, h);
  return view.keys[slot / view.page_slots][slot % view.page_slots];  // dimension 0
}

const std::vector<int32_t> kPrompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 whole blocks and 2 tokens

TEST(PrefixCache, AStoredPrefixIsFoundUpToTheFirstDifferentToken) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  EXPECT_EQ(prefixes.publish(1, kPrompt, 8), 8);
  EXPECT_EQ(prefixes.pages_held(), 2u * 4);  // 2 blocks x (2 layers x 2 heads)

  std::vector<std::vector<int32_t>> pages;
  EXPECT_EQ(prefixes.lookup(kPrompt, 40, pages), 8);
  ASSERT_EQ(pages.size(), 4u);
  EXPECT_EQ(pages[3], std::vector<int32_t>(cache.page_ids(1, 1, 1).begin(), cache.page_ids(1, 1, 1).begin() + 2));
  EXPECT_EQ(prefixes.lookup(kPrompt, 4, pages), 4);  // max_tokens
  const std::vector<int32_t> second_differs = {1, 2, 3, 4, 5, 6, 0, 8, 9};
  EXPECT_EQ(prefixes.lookup(second_differs, 40, pages), 6);  // block 0, then two tokens of block 1
  EXPECT_EQ(pages[3], std::vector<int32_t>(cache.page_ids(1, 1, 1).begin(), cache.page_ids(1, 1, 1).begin() + 2));
  const std::vector<int32_t> first_differs = {0, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(prefixes.lookup(first_differs, 40, pages), 0);
  const std::vector<int32_t> short_prompt = {1, 2, 3};
  EXPECT_EQ(prefixes.lookup(short_prompt, 40, pages), 3);  // the start of block 0
  EXPECT_EQ(prefixes.lookup(kPrompt, 7, pages), 7);        // max_tokens inside a block

  PrefixCache other_model(cache, kFingerprint + 1, 1000);  // another fingerprint shares nothing
  EXPECT_EQ(other_model.lookup(kPrompt, 40, pages), 0);
}

TEST(PrefixCache, ASequencesTailIsFoundTokenByToken) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  EXPECT_EQ(prefixes.publish(1, kPrompt, 10), 10);  // two blocks and a tail of two tokens
  EXPECT_EQ(prefixes.blocks(), 3u);
  EXPECT_EQ(prefixes.publish(1, kPrompt, 10), 10);  // stored already
  EXPECT_EQ(prefixes.blocks(), 3u);
  std::vector<std::vector<int32_t>> pages;
  const std::vector<int32_t> longer = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_EQ(prefixes.lookup(longer, 40, pages), 10);
  ASSERT_EQ(pages[0].size(), 3u);
  EXPECT_EQ(pages[0][2], cache.page_ids(1, 0, 0)[2]);
  const std::vector<int32_t> tail_differs = {1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 11};
  EXPECT_EQ(prefixes.lookup(tail_differs, 40, pages), 9);

  // Adopted with 9 slots, the shared last page is copied on the first append.
  cache.add_sequence(2);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) cache.adopt_pages(2, l, h, pages[size_t(l * 2 + h)], 9);
  }
  EXPECT_EQ(cache.n_slots(2, 1, 1), 9);
  cache.add_sequence(3);
  EXPECT_THROW(cache.adopt_pages(3, 0, 0, pages[0], 4), Error);  // 4 slots in three pages
  EXPECT_THROW(cache.adopt_pages(3, 0, 0, pages[0], 13), Error);
  cache.reserve(2, 1);
  const std::vector<uint16_t> k(8, 777), v(8, 0);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) cache.append(2, l, h, 9, k.data(), v.data());
  }
  EXPECT_NE(cache.page_ids(2, 0, 0)[2], cache.page_ids(1, 0, 0)[2]);
  EXPECT_EQ(key_of_slot(cache, 2, 0, 0, 8), kPrompt[8] + 100);  // the copy keeps sequence 1's rows
  EXPECT_EQ(key_of_slot(cache, 2, 0, 0, 9), 777);
  EXPECT_EQ(key_of_slot(cache, 1, 0, 0, 9), kPrompt[9] + 100);  // and sequence 1 keeps its own
}

// A sequence that took part of a stored tail and wrote nothing after it
// holds that same page: ending, it stores nothing new, and the cache can
// still give every page back.
TEST(PrefixCache, ATailTakenAndLeftUnwrittenIsNotStoredTwice) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7};
  prefill(cache, 1, a);
  EXPECT_EQ(prefixes.publish(1, a, 7), 7);
  cache.remove_sequence(1);
  const std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 9, 9};
  std::vector<std::vector<int32_t>> pages;
  ASSERT_EQ(prefixes.lookup(b, 6, pages), 6);
  cache.add_sequence(2);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) cache.adopt_pages(2, l, h, pages[size_t(l * 2 + h)], 6);
  }
  EXPECT_EQ(prefixes.publish(2, b, 6), 6);  // its tail {5, 6} starts a's: nothing new
  EXPECT_EQ(prefixes.blocks(), 2u);
  EXPECT_EQ(prefixes.pages_held(), 8u);
  cache.remove_sequence(2);
  EXPECT_EQ(prefixes.reclaim(100), 8u);
  EXPECT_EQ(cache.bytes_used(), 0u);
}

TEST(PrefixCache, AdoptedPagesOutliveTheirDonorAndReadAsItsPrefill) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  prefixes.publish(1, kPrompt, 8);
  cache.remove_sequence(1);
  EXPECT_EQ(cache.bytes_used(), 8 * cache.page_bytes());  // the cache's blocks stay

  std::vector<std::vector<int32_t>> pages;
  ASSERT_EQ(prefixes.lookup(kPrompt, 8, pages), 8);
  cache.add_sequence(2);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) cache.adopt_pages(2, l, h, pages[size_t(l * 2 + h)]);
  }
  for (int s = 0; s < 8; ++s) EXPECT_EQ(key_of_slot(cache, 2, 1, 0, s), kPrompt[size_t(s)] + 100);  // sequence 1's rows
  EXPECT_EQ(cache.max_position(2), 7);
}

TEST(PrefixCache, ACompactedHeadIsNotPublishedPastItsChange) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  const std::vector<int32_t> keep = {0, 1, 2, 3, 5, 6, 7, 8, 9};  // token 4 evicted in one head
  cache.compact(1, 1, 0, keep);
  EXPECT_EQ(prefixes.publish(1, kPrompt, 8), 4);
  std::vector<std::vector<int32_t>> pages;
  EXPECT_EQ(prefixes.lookup(kPrompt, 8, pages), 4);
}

TEST(PrefixCache, PublishingAgainKeepsTheStoredBlocksAndAddsTheNewOnes) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  prefixes.publish(1, kPrompt, 4);
  const std::vector<int32_t> longer = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  prefill(cache, 2, longer);
  EXPECT_EQ(prefixes.publish(2, longer, 12), 12);
  EXPECT_EQ(prefixes.blocks(), 3u);
  std::vector<std::vector<int32_t>> pages;
  ASSERT_EQ(prefixes.lookup(longer, 12, pages), 12);
  EXPECT_EQ(pages[0][0], cache.page_ids(1, 0, 0)[0]);  // block 0 is still sequence 1's
  EXPECT_EQ(pages[0][1], cache.page_ids(2, 0, 0)[1]);
}

// What a tier needs: the chain keys of a prompt's blocks, how many of them
// are stored, the whole blocks a publish added, and blocks inserted from
// pages the caller loaded (each only after the one before it).
TEST(PrefixCache, BlocksFromElsewhereAreInsertedAfterTheirChain) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  std::vector<PrefixCache::NewBlock> added;
  EXPECT_EQ(prefixes.publish(1, kPrompt, 10, &added), 10);
  ASSERT_EQ(added.size(), 2u);  // the tail is not a whole block
  EXPECT_EQ(added[1].first, 4);
  EXPECT_EQ(added[1].pages[3], cache.page_ids(1, 1, 1)[1]);
  const std::vector<uint64_t> keys = prefixes.block_keys(kPrompt, 5);
  ASSERT_EQ(keys.size(), 2u);  // whole blocks only
  EXPECT_EQ(added[0].key, keys[0]);
  EXPECT_EQ(added[1].key, keys[1]);
  added.clear();
  prefixes.publish(1, kPrompt, 10, &added);
  EXPECT_EQ(added.size(), 2u);  // stored already, but not yet exported
  prefixes.mark_exported(keys[0]);
  prefixes.mark_exported(keys[1]);
  added.clear();
  prefixes.publish(1, kPrompt, 10, &added);
  EXPECT_TRUE(added.empty());

  KvCache other(small_config());
  PrefixCache fetched(other, kFingerprint, 1000);
  EXPECT_EQ(fetched.block_keys(kPrompt, 2), keys);  // the same chain in another process
  EXPECT_EQ(fetched.stored_blocks(kPrompt, 2), 0);
  const auto load = [&](int32_t block) {
    std::vector<int32_t> pages;
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        const uint8_t* data = cache.page_data(cache.page_ids(1, l, h)[size_t(block)]);
        pages.push_back(other.load_page(std::span(data, cache.page_bytes())));
      }
    }
    return pages;
  };
  const auto block_tokens = [&](int32_t block) { return std::span(kPrompt).subspan(size_t(block) * 4, 4); };
  uint64_t root = 0;
  EXPECT_EQ(fetched.stored_blocks(kPrompt, 2, &root), 0);
  const std::vector<int32_t> block1 = load(1);
  EXPECT_THROW(fetched.insert(keys[0], block_tokens(1), block1), Error);  // block 0 is not there
  const std::vector<int32_t> block0 = load(0);
  EXPECT_EQ(fetched.insert(root, block_tokens(0), block0), keys[0]);
  EXPECT_EQ(fetched.insert(keys[0], block_tokens(1), block1), keys[1]);
  const std::vector<int32_t> again = load(1);
  // There already: the caller keeps its references.
  EXPECT_EQ(fetched.insert(keys[0], block_tokens(1), again), std::nullopt);
  other.release_pages(again);
  EXPECT_EQ(other.bytes_used(), 8 * other.page_bytes());
  uint64_t last = 0;
  EXPECT_EQ(fetched.stored_blocks(kPrompt, 5, &last), 2);
  EXPECT_EQ(last, keys[1]);
  std::vector<std::vector<int32_t>> pages;
  EXPECT_EQ(fetched.lookup(kPrompt, 40, pages), 8);
  other.add_sequence(2);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) other.adopt_pages(2, l, h, pages[size_t(l * 2 + h)]);
  }
  for (int slot = 0; slot < 8; ++slot) EXPECT_EQ(key_of_slot(other, 2, 1, 0, slot), key_of_slot(cache, 1, 1, 0, slot));
}

TEST(PrefixCache, ReclaimDropsLeastRecentLeavesNoSequenceShares) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> b = {9, 9, 9, 9};
  prefill(cache, 1, a);
  prefill(cache, 2, b);
  prefixes.publish(1, a, 8);
  prefixes.publish(2, b, 4);
  cache.remove_sequence(1);  // a's pages are the cache's alone; b's are shared with sequence 2
  std::vector<std::vector<int32_t>> pages;
  prefixes.lookup(a, 8, pages);  // a is now more recent than b
  const size_t before = cache.bytes_used();
  EXPECT_EQ(prefixes.reclaim(1), 4u);  // b (least recent, but shared: it would free nothing) stays; a's block 1 goes
  EXPECT_EQ(prefixes.blocks(), 2u);    // a's block 0 and b remain
  EXPECT_EQ(cache.bytes_used(), before - 4 * cache.page_bytes());
  EXPECT_EQ(prefixes.lookup(a, 8, pages), 4);
  EXPECT_EQ(prefixes.lookup(b, 4, pages), 4);
  EXPECT_EQ(prefixes.reclaim(100), 4u);  // a's block 0; b stays while sequence 2 shares it
  EXPECT_EQ(prefixes.pages_held(), 4u);
  cache.remove_sequence(2);
  EXPECT_EQ(prefixes.reclaim(100), 4u);
  EXPECT_EQ(prefixes.pages_held(), 0u);
}

TEST(PrefixCache, ItHoldsAtMostMaxPages) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, /*max_pages=*/8);  // two blocks
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> b = {9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7};
  prefill(cache, 1, a);
  prefill(cache, 2, b);
  EXPECT_EQ(prefixes.publish(1, a, 8), 8);
  EXPECT_EQ(prefixes.publish(2, b, 12), 8);  // a's blocks make room; b's third would need a fourth block's pages
  EXPECT_LE(prefixes.pages_held(), 8u);
  std::vector<std::vector<int32_t>> pages;
  EXPECT_EQ(prefixes.lookup(b, 12, pages), 8);
  EXPECT_EQ(prefixes.lookup(a, 8, pages), 0);
}

}  // namespace
}  // namespace lazykv
