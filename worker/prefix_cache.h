// Prompt prefixes computed once (issue 26's prompt KV reuse, in one
// process). A sequence's pages (page_slots tokens each, positions 0, 1, ...
// in order) are kept here by reference as blocks, keyed by a chain hash of
// their token ids: block i's key covers blocks 0..i, seeded with a
// fingerprint of the model and cache shape, so two prompts share key i
// exactly when they share their first i+1 blocks. The last block of a
// sequence that ended may be partial (a tail). A later prompt that starts
// with stored blocks adopts their pages (KvCache::adopt_pages), then as much
// of a stored block or tail after them as it has in common, token by token,
// and prefills only the rest. Token ids are compared on every hit, so a hash
// collision is a miss, never wrong KV.
//
// Pages are shared, not copied: KvCache copies a shared page before any
// write, so eviction in one sequence never changes what another reads. The
// cache holds at most `max_pages` page references and drops least recently
// used blocks that no longer block starts from (leaves first); reclaim()
// frees pages on demand. Not thread-safe: the worker's step thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "worker/kv_cache.h"

namespace lazykv {

class PrefixCache {
 public:
  PrefixCache(KvCache& cache, uint64_t fingerprint, size_t max_pages);
  ~PrefixCache();  // releases every page it holds
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The most tokens (at most max_tokens) at the start of `prompt` whose KV
  // is stored: whole blocks, then the longest common start of a block or
  // tail stored after them (a quarter of a block at least). `pages[layer * n_head_kv + kv_head]` gets their
  // pages in order, the last one partly used when the count is not a
  // multiple of the block. Marks them used.
  int32_t lookup(std::span<const int32_t> prompt, int32_t max_tokens, std::vector<std::vector<int32_t>>& pages);

  // A whole block publish() stored, or found stored but not yet exported.
  struct NewBlock {
    uint64_t key = 0;
    int32_t first = 0;           // position of its first token
    std::vector<int32_t> pages;  // [layer * n_head_kv + kv_head]
  };

  // Stores the first `n_tokens` of `tokens` from sequence `seq`, which must
  // hold them from position 0 in every (layer, KV head) (one cache head per
  // KV head): whole blocks, then what is left (under a block) as a tail. A
  // head that was compacted or holds other positions ends the publication
  // there. Publish a tail only once the sequence writes no more to that
  // page (at its end). Blocks stored already are kept (and marked used).
  // Returns the tokens the cache holds for the start of `tokens`; `added`,
  // when given, receives the whole blocks stored by this call and those
  // stored before that no mark_exported() has marked (a tier refused them).
  int32_t publish(SeqId seq, std::span<const int32_t> tokens, int32_t n_tokens,
                  std::vector<NewBlock>* added = nullptr);

  // --- whole blocks to and from elsewhere (a tier: PrefixTier) ---
  // The block is in the tiers: publish() no longer reports it.
  void mark_exported(uint64_t key);
  // The chain keys of the first n_blocks whole blocks of `tokens`.
  std::vector<uint64_t> block_keys(std::span<const int32_t> tokens, int32_t n_blocks) const;
  // How many whole blocks at the start of `tokens` (at most max_blocks) are
  // stored; `last_key`, when given, receives the last one's key (the chain's
  // root with none), the parent of the block after them.
  int32_t stored_blocks(std::span<const int32_t> tokens, int32_t max_blocks, uint64_t* last_key = nullptr) const;
  // Stores a whole block after `parent` (a key stored_blocks or insert gave,
  // so the chain before it was compared token by token) from `pages`, one per
  // (layer, KV head), whose references the caller hands over. Returns its
  // key, the parent of the next block; nullopt, taking none of the pages,
  // when the block is there already or there is no room.
  std::optional<uint64_t> insert(uint64_t parent, std::span<const int32_t> block, std::span<const int32_t> pages);

  // Drops least recently used leaf blocks no sequence shares, never `keep`,
  // until `pages` pages went back to the pool or no such block is left.
  // Returns the pages that went back.
  size_t reclaim(size_t pages, std::optional<uint64_t> keep = std::nullopt);

  size_t pages_held() const { return pages_held_; }
  // Of pages_held(), those no sequence shares (reclaim could free them).
  size_t reclaimable_pages() const;
  size_t blocks() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t parent = 0;           // the key of the block before (the fingerprint for block 0)
    std::vector<int32_t> tokens;   // page_slots token ids, fewer in a tail
    std::vector<int32_t> pages;    // [layer * n_head_kv + kv_head]
    uint64_t used = 0;             // tick of the last lookup or publish
    bool exported = false;         // in the tiers (put there, or fetched from there)
  };
  uint64_t key_of(uint64_t parent, std::span<const int32_t> tokens) const;
  // The keys of the stored whole blocks at the start of `tokens`, at most
  // max_blocks, each found by its parent and compared token by token.
  std::vector<uint64_t> stored_chain(std::span<const int32_t> tokens, int32_t max_blocks) const;
  const Entry* find(uint64_t parent, std::span<const int32_t> tokens, uint64_t& key) const;
  // Marks used, and returns true, a block or tail stored after `parent` that
  // starts with `tail` (a sequence that adopted part of it and wrote nothing
  // after: publishing it again would hold the same page twice).
  bool touch_covering_sibling(uint64_t parent, std::span<const int32_t> tail);
  // Drops least recently used leaves (never `parent`) until one more block
  // fits within max_pages; false if it cannot.
  bool make_room(uint64_t parent);
  // Stores e under key; the cache takes the caller's references to e.pages.
  void add(uint64_t key, Entry e);
  // Drops one entry (a leaf); returns the pages that went back to the pool.
  size_t drop(uint64_t key);
  // The least recently used block nothing stored follows, other than
  // `keep`; with `freeing`, only one no sequence shares (dropping it frees pages).
  std::optional<uint64_t> lru_leaf(std::optional<uint64_t> keep, bool freeing) const;

  KvCache& cache_;
  uint64_t fingerprint_;
  size_t max_pages_;
  int block_tokens_;
  size_t heads_;  // n_layer * n_head_kv
  std::unordered_map<uint64_t, Entry> entries_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> next_;  // parent key (or fingerprint) -> keys stored after it
  size_t pages_held_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace lazykv
