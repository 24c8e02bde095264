// PrefixTier: the prompt blocks one prefix cache puts to the tiers come back
// bit for bit into another's (another worker, or the same after a restart),
// and anything else (a block that is missing, foreign, cut short, damaged on
// disk or does not fit the cache; tiers that are off) ends the fetch there,
// so the rest is computed and never read from a wrong block.
#include "worker/tiers/prefix_tier.h"

#include <gtest/gtest.h>

#include <rocksdb/db.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/local_block_store.h"

namespace lazykv::tiers {
namespace {

// 2 layers, 2 KV heads, head_dim 8, 4-slot pages: a block is 4 tokens.
KvCacheConfig small_config(size_t capacity = 0) { return {2, 2, 8, 4, capacity}; }
constexpr uint64_t kFingerprint = 42;
constexpr size_t kHeads = 4;  // layers x KV heads: pages per block
const std::vector<int32_t> kPrompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 whole blocks and 2 tokens

std::shared_ptr<TierMover> in_process_tiers(uint64_t max_queued_bytes = 256ull << 20) {
  kvstore::TierStoreOptions options;
  options.host_capacity_bytes = 1 << 20;
  options.host_alloc_unit = 256;
  return std::make_shared<TierMover>(std::make_unique<kvstore::LocalBlockStore>(options), max_queued_bytes);
}

// A KV cache with its prefix cache and tier, as one worker has them.
struct Worker {
  explicit Worker(std::shared_ptr<TierMover> mover, size_t capacity = 0, uint64_t fingerprint = kFingerprint)
      : cache(small_config(capacity)), prefix(cache, fingerprint, 1000), tier(cache, prefix, fingerprint, 0, mover) {}
  // Prefills `prompt` into sequence 1 (token t's K rows all t, V rows all
  // t + 1000), publishes it and puts its new blocks.
  void prefill_and_put(const std::vector<int32_t>& prompt) {
    prefill(prompt);
    EXPECT_EQ(publish_and_put(prompt, int32_t(prompt.size())), prompt.size() / 4);  // the tail stays local
  }
  void prefill(const std::vector<int32_t>& prompt) {
    cache.add_sequence(1);
    cache.reserve(1, int(prompt.size()));
    for (size_t t = 0; t < prompt.size(); ++t) {
      const std::vector<uint16_t> k(8, uint16_t(prompt[t])), v(8, uint16_t(prompt[t] + 1000));
      for (int l = 0; l < 2; ++l) {
        for (int h = 0; h < 2; ++h) cache.append(1, l, h, int32_t(t), k.data(), v.data());
      }
    }
  }
  // Publishes the first n tokens of sequence 1 and puts the whole blocks
  // that added; returns how many.
  size_t publish_and_put(const std::vector<int32_t>& prompt, int32_t n) {
    std::vector<PrefixCache::NewBlock> added;
    prefix.publish(1, prompt, n, &added);
    tier.put(added, prompt);
    return added.size();
  }
  KvCache cache;
  PrefixCache prefix;
  PrefixTier tier;
};

// The stored block `index` replaced by `bytes`.
void overwrite(TierMover& mover, const Worker& w, int32_t index, std::vector<uint8_t> bytes) {
  mover.put(w.tier.block_key(w.prefix.block_keys(kPrompt, index + 1).back(), index), std::move(bytes), {1, true});
  mover.flush();
}

TEST(PrefixTier, BlocksOneCachePutComeBackBitForBitIntoAnother) {
  const auto mover = in_process_tiers();
  Worker first(mover);
  first.prefill_and_put(kPrompt);
  mover->flush();
  EXPECT_EQ(mover->store_stats().host_blocks, 2u);

  Worker second(mover);
  EXPECT_EQ(second.tier.fetch(kPrompt, 40), 8);
  EXPECT_EQ(second.tier.fetched_bytes(), 2 * second.tier.block_bytes());
  EXPECT_EQ(second.tier.block_bytes(), 4 * sizeof(int32_t) + kHeads * second.cache.page_bytes());
  std::vector<std::vector<int32_t>> pages;
  ASSERT_EQ(second.prefix.lookup(kPrompt, 40, pages), 8);
  for (size_t h = 0; h < kHeads; ++h) {
    const auto theirs = first.cache.page_ids(1, int(h / 2), int(h % 2));
    for (size_t b = 0; b < 2; ++b) {
      EXPECT_EQ(std::memcmp(second.cache.page_data(pages[h][b]), first.cache.page_data(theirs[b]),
                            first.cache.page_bytes()),
                0)
          << "head " << h << " block " << b;
    }
  }
  EXPECT_EQ(second.tier.fetch(kPrompt, 40), 0);  // held already

  Worker third(mover);
  EXPECT_EQ(third.tier.fetch(kPrompt, 7), 4);  // max_tokens: whole blocks within it
  Worker other_model(mover, 0, kFingerprint + 1);
  EXPECT_EQ(other_model.tier.fetch(kPrompt, 40), 0);
  const std::vector<int32_t> other_start = {1, 2, 3, 0, 5, 6, 7, 8};
  EXPECT_EQ(third.tier.fetch(other_start, 40), 0);
}

TEST(PrefixTier, AForeignOrShortBlockEndsTheFetchThereAndTakesNoPage) {
  const auto mover = in_process_tiers();
  Worker first(mover);
  first.prefill_and_put(kPrompt);
  mover->flush();

  // Block 1 under its key with other token ids (what a hash collision would
  // look like): block 0 is fetched, block 1 computed.
  std::vector<uint8_t> foreign(first.tier.block_bytes(), 0);
  overwrite(*mover, first, 1, foreign);
  Worker second(mover);
  EXPECT_EQ(second.tier.fetch(kPrompt, 40), 4);
  EXPECT_EQ(second.cache.bytes_used(), kHeads * second.cache.page_bytes());  // block 0's pages, held by the cache
  EXPECT_EQ(second.prefix.pages_held(), kHeads);

  // Cut short: the same.
  std::vector<uint8_t> short_block(first.tier.block_bytes() / 2);
  std::memcpy(short_block.data(), kPrompt.data() + 4, 4 * sizeof(int32_t));
  overwrite(*mover, first, 1, short_block);
  Worker third(mover);
  EXPECT_EQ(third.tier.fetch(kPrompt, 40), 4);
  EXPECT_EQ(third.cache.bytes_used(), kHeads * third.cache.page_bytes());

  // Missing: dropped from the store.
  mover->drop(first.tier.block_key(first.prefix.block_keys(kPrompt, 1).back(), 0));
  mover->flush();
  Worker fourth(mover);
  EXPECT_EQ(fourth.tier.fetch(kPrompt, 40), 0);
  EXPECT_EQ(fourth.cache.bytes_used(), 0u);
}

// A block the NVMe tier holds whose bytes were damaged on disk (one byte
// flipped in RocksDB) fails its checksum when it is fetched: the fetch ends
// before it, so that block and the rest are computed, and the store erases it.
TEST(PrefixTier, ABlockFlippedInRocksDbIsDetectedAndComputedInstead) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("lazykv-prefix-tier-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  kvstore::TierStoreOptions options;
  options.host_capacity_bytes = 1024;  // one block (528 bytes in 768): the older ones go on to NVMe
  options.host_alloc_unit = 256;
  options.replacement = "lru";
  options.nvme_path = (dir / "db").string();
  kvstore::BlockKey damaged;
  {
    const auto mover = std::make_shared<TierMover>(std::make_unique<kvstore::LocalBlockStore>(options));
    Worker first(mover);
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // three whole blocks
    first.prefill(prompt);
    for (int32_t n = 4; n <= 12; n += 4) {  // one at a time: the store sees them in order
      EXPECT_EQ(first.publish_and_put(prompt, n), 1u);
      mover->flush();
    }
    EXPECT_EQ(mover->store_stats().nvme_blocks, 2u);  // blocks 0 and 1; block 2 in host memory
    damaged = first.tier.block_key(first.prefix.block_keys(prompt, 2).back(), 1);
  }  // the store closes: NVMe keeps blocks 0 and 1
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), options.nvme_path, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const auto encoded = kvstore::encode_block_key(damaged);
    const std::string key(encoded.begin(), encoded.end());
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), key, &value).ok());
    value[value.size() / 2] ^= 0x01;  // inside the block's pages
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, value).ok());
    ASSERT_TRUE(db->Close().ok());
  }
  const auto mover = std::make_shared<TierMover>(std::make_unique<kvstore::LocalBlockStore>(options));
  Worker second(mover);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  EXPECT_EQ(second.tier.fetch(prompt, 40), 4);  // block 0; block 1 is damaged
  EXPECT_EQ(second.cache.bytes_used(), kHeads * second.cache.page_bytes());
  EXPECT_GE(mover->stats().failures, 1u);
  Worker third(mover);
  EXPECT_EQ(third.tier.fetch(prompt, 40), 4);  // and stays a miss
  std::filesystem::remove_all(dir);
}

TEST(PrefixTier, ABlockTheMoverRefusedIsOfferedAgainAtThePromptsNextPublish) {
  const auto mover = in_process_tiers();
  Worker worker(mover);
  const auto full = in_process_tiers(1);  // a queue no block fits
  PrefixTier refusing(worker.cache, worker.prefix, kFingerprint, 0, full);
  worker.prefill(kPrompt);
  std::vector<PrefixCache::NewBlock> added;
  worker.prefix.publish(1, kPrompt, 10, &added);
  ASSERT_EQ(added.size(), 2u);
  refusing.put(added, kPrompt);
  EXPECT_EQ(full->stats().refused, 1u);  // the first refusal ends the put
  // The same prompt again (a later sequence), through a mover with room.
  EXPECT_EQ(worker.publish_and_put(kPrompt, 10), 2u);
  mover->flush();
  EXPECT_EQ(mover->store_stats().host_blocks, 2u);
  EXPECT_EQ(worker.publish_and_put(kPrompt, 10), 0u) << "in the tiers now: not offered again";
}

TEST(PrefixTier, NoRoomInTheCacheOrNoTiersMeansComputing) {
  const auto mover = in_process_tiers();
  Worker first(mover);
  first.prefill_and_put(kPrompt);
  mover->flush();

  // Room for block 0's four pages and one more: block 1 does not fit.
  Worker small(mover, 5 * first.cache.page_bytes());
  EXPECT_EQ(small.tier.fetch(kPrompt, 40), 4);
  EXPECT_EQ(small.cache.bytes_used(), kHeads * small.cache.page_bytes());

  // Full of an older prompt the prefix cache keeps: it gives it back for the fetched one.
  Worker full(mover, 8 * first.cache.page_bytes());
  const std::vector<int32_t> older = {50, 51, 52, 53};
  full.prefill(older);
  full.publish_and_put(older, 4);
  full.cache.remove_sequence(1);
  std::vector<std::vector<int32_t>> pages;
  EXPECT_EQ(full.tier.fetch(kPrompt, 40), 8);
  EXPECT_EQ(full.prefix.lookup(older, 4, pages), 0) << "the older prompt made room";
  EXPECT_EQ(full.prefix.lookup(kPrompt, 40, pages), 8);
  EXPECT_EQ(full.cache.bytes_used(), 2 * kHeads * full.cache.page_bytes());

  const auto off = std::make_shared<TierMover>(nullptr, 0, "no kvstore");
  Worker unplugged(off);
  unplugged.prefill_and_put(kPrompt);  // puts nothing, fails nothing
  Worker after(off);
  EXPECT_EQ(after.tier.fetch(kPrompt, 40), 0);
  EXPECT_EQ(off->stats().blocks_demoted, 0u);
}

}  // namespace
}  // namespace lazykv::tiers
