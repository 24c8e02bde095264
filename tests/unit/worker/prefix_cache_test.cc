#include "worker/prefix_cache.h"

#include <gtest/gtest.h>

#include <vector>

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

TEST(PrefixCache, AStoredPrefixIsFoundUpToTheFirstDifferentBlock) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  EXPECT_EQ(prefixes.publish(1, kPrompt, 2), 2);
  EXPECT_EQ(prefixes.pages_held(), 2u * 4);  // 2 blocks x (2 layers x 2 heads)

  std::vector<std::vector<int32_t>> pages;
  EXPECT_EQ(prefixes.lookup(kPrompt, 10, pages), 2);
  ASSERT_EQ(pages.size(), 4u);
  EXPECT_EQ(pages[3], std::vector<int32_t>(cache.page_ids(1, 1, 1).begin(), cache.page_ids(1, 1, 1).begin() + 2));
  EXPECT_EQ(prefixes.lookup(kPrompt, 1, pages), 1);  // max_blocks
  const std::vector<int32_t> second_differs = {1, 2, 3, 4, 5, 6, 0, 8, 9};
  EXPECT_EQ(prefixes.lookup(second_differs, 10, pages), 1);
  const std::vector<int32_t> first_differs = {0, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(prefixes.lookup(first_differs, 10, pages), 0);
  const std::vector<int32_t> short_prompt = {1, 2, 3};
  EXPECT_EQ(prefixes.lookup(short_prompt, 10, pages), 0);

  PrefixCache other_model(cache, kFingerprint + 1, 1000);  // another fingerprint shares nothing
  EXPECT_EQ(other_model.lookup(kPrompt, 10, pages), 0);
}

TEST(PrefixCache, AdoptedPagesOutliveTheirDonorAndReadAsItsPrefill) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  prefixes.publish(1, kPrompt, 2);
  cache.remove_sequence(1);
  EXPECT_EQ(cache.bytes_used(), 8 * cache.page_bytes());  // the cache's blocks stay

  std::vector<std::vector<int32_t>> pages;
  ASSERT_EQ(prefixes.lookup(kPrompt, 2, pages), 2);
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
  EXPECT_EQ(prefixes.publish(1, kPrompt, 2), 1);
  std::vector<std::vector<int32_t>> pages;
  EXPECT_EQ(prefixes.lookup(kPrompt, 2, pages), 1);
}

TEST(PrefixCache, PublishingAgainKeepsTheStoredBlocksAndAddsTheNewOnes) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  prefill(cache, 1, kPrompt);
  prefixes.publish(1, kPrompt, 1);
  const std::vector<int32_t> longer = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  prefill(cache, 2, longer);
  EXPECT_EQ(prefixes.publish(2, longer, 3), 3);
  EXPECT_EQ(prefixes.blocks(), 3u);
  std::vector<std::vector<int32_t>> pages;
  ASSERT_EQ(prefixes.lookup(longer, 3, pages), 3);
  EXPECT_EQ(pages[0][0], cache.page_ids(1, 0, 0)[0]);  // block 0 is still sequence 1's
  EXPECT_EQ(pages[0][1], cache.page_ids(2, 0, 0)[1]);
}

TEST(PrefixCache, ReclaimDropsLeastRecentLeavesAndCountsOnlyPagesThatGoBack) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, 1000);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> b = {9, 9, 9, 9};
  prefill(cache, 1, a);
  prefill(cache, 2, b);
  prefixes.publish(1, a, 2);
  prefixes.publish(2, b, 1);
  cache.remove_sequence(1);  // a's pages are the cache's alone; b's are shared with sequence 2
  std::vector<std::vector<int32_t>> pages;
  prefixes.lookup(a, 2, pages);  // a is now more recent than b
  const size_t before = cache.bytes_used();
  EXPECT_EQ(prefixes.reclaim(1), 4u);  // b (a leaf, least recent) frees nothing; then a's block 1 frees 4
  EXPECT_EQ(prefixes.blocks(), 1u);    // a's block 0 remains
  EXPECT_EQ(cache.bytes_used(), before - 4 * cache.page_bytes());
  EXPECT_EQ(prefixes.lookup(a, 2, pages), 1);
  EXPECT_EQ(prefixes.lookup(b, 1, pages), 0);
  EXPECT_EQ(prefixes.reclaim(100), 4u);  // everything left
  EXPECT_EQ(prefixes.pages_held(), 0u);
}

TEST(PrefixCache, ItHoldsAtMostMaxPages) {
  KvCache cache(small_config());
  PrefixCache prefixes(cache, kFingerprint, /*max_pages=*/8);  // two blocks
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> b = {9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7};
  prefill(cache, 1, a);
  prefill(cache, 2, b);
  EXPECT_EQ(prefixes.publish(1, a, 2), 2);
  EXPECT_EQ(prefixes.publish(2, b, 3), 2);  // a's blocks make room; b's third would need a fourth block's pages
  EXPECT_LE(prefixes.pages_held(), 8u);
  std::vector<std::vector<int32_t>> pages;
  EXPECT_EQ(prefixes.lookup(b, 3, pages), 2);
  EXPECT_EQ(prefixes.lookup(a, 2, pages), 0);
}

}  // namespace
}  // namespace lazykv
