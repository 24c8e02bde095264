// Prompt KV reuse through the tiers (issue 26): the whole blocks a worker's
// PrefixCache stores are also put to the tiers (the node's kvstore, or the
// in-process host and NVMe tiers), and a prompt whose next blocks the local
// cache lacks fetches them from there into it before it looks up. So a
// replica, a restarted worker or a worker whose cache dropped a prefix
// reuses what any worker of the node computed.
//
// A block in the tiers is one prefix-cache block: its token ids, then its
// cache pages (every layer and KV head of this worker, in the prefix cache's
// order) as the pool holds them: one get per page of tokens. Its key is the
// block's chain key under the prefix cache's fingerprint (the model's
// content and how the worker stores KV), never a process's, and it is put
// as shared, so the kvstore keeps it when the worker that put it goes.
// Every fetched block is checked: the kvstore's checksum, its size and its
// token ids against the prompt's. A block that is missing, corrupt or
// unreadable ends the fetch there; the rest of the prompt is computed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "worker/kv_cache.h"
#include "worker/prefix_cache.h"
#include "worker/tiers/tier_mover.h"

namespace lazykv::tiers {

class PrefixTier {
 public:
  // The cache and prefix cache must outlive this; the mover is shared.
  // first_kv_head: the model's KV head the cache's head 0 is (a tensor-
  // parallel rank's first), so ranks' blocks have keys of their own.
  PrefixTier(KvCache& cache, PrefixCache& prefix, uint64_t fingerprint, uint32_t first_kv_head,
             std::shared_ptr<TierMover> mover);

  // Puts the blocks that publish() reported (blocks of `tokens`), marking
  // them exported. Queued: the mover refuses what does not fit its queue,
  // and nothing waits; a refused block is reported again at the prompt's
  // next publish.
  void put(std::span<const PrefixCache::NewBlock> blocks, std::span<const int32_t> tokens);
  // Fetches, block by block, the whole blocks of `prompt` (within the first
  // max_tokens) that follow those the prefix cache holds, into it. Returns
  // the tokens fetched. Blocks the step until they arrive (2 s at most:
  // the rest is then computed).
  int32_t fetch(std::span<const int32_t> prompt, int32_t max_tokens);

  // Bytes of blocks fetched into the prefix cache so far, and the time
  // fetch() took (blocks found and missed).
  uint64_t fetched_bytes() const { return fetched_bytes_; }
  double fetch_seconds() const { return fetch_seconds_; }
  // Bytes of one block in the tiers.
  size_t block_bytes() const { return block_tokens_ * sizeof(int32_t) + heads_ * cache_.page_bytes(); }
  // The kvstore key of block `index` of the chain (chain_key: its prefix-cache key).
  kvstore::BlockKey block_key(uint64_t chain_key, int32_t index) const;

 private:
  // Fetches blocks held .. wanted - 1 (all that follow the stored ones);
  // returns how many arrived, in order, into the prefix cache.
  int32_t fetch_blocks(std::span<const int32_t> prompt, int32_t held, int32_t wanted, uint64_t parent);
  // The pages of a fetched block (no longer pending), checked against the
  // prompt's tokens; false (no page taken) when it failed, does not match or
  // does not fit, even after the prefix cache gave back unshared blocks
  // other than `parent` (the chain it extends).
  bool load_block(Fetch& fetch, std::span<const int32_t> block_tokens, uint64_t parent, std::vector<int32_t>& pages);

  KvCache& cache_;
  PrefixCache& prefix_;
  uint64_t fingerprint_;
  uint32_t first_kv_head_;
  std::shared_ptr<TierMover> mover_;
  size_t block_tokens_;
  size_t heads_;  // n_layer * n_head_kv: pages per block
  uint64_t fetched_bytes_ = 0;
  double fetch_seconds_ = 0;
};

}  // namespace lazykv::tiers
