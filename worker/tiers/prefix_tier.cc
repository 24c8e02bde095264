#include "worker/tiers/prefix_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "common/error.h"

namespace lazykv::tiers {
namespace {

// The hint prompt blocks go with: soon enough to be admitted to NVMe
// (TierStoreOptions::nvme_admit_horizon_steps) rather than dropped when the
// host tier evicts them, since a prompt's blocks are read by its next turn.
constexpr uint64_t kPromptBlockReuseSteps = 1024;
// Blocks whose fetches are queued ahead of the one being read, so the
// mover's lanes do not idle between blocks; a miss wastes at most these.
constexpr int32_t kBlocksAhead = 4;
// The longest a step waits for a prompt's blocks (they may queue behind
// demotions): past it, the rest of the prompt is computed.
constexpr std::chrono::milliseconds kFetchDeadline{2000};

}  // namespace

PrefixTier::PrefixTier(KvCache& cache, PrefixCache& prefix, uint64_t fingerprint, uint32_t first_kv_head,
                       std::shared_ptr<TierMover> mover)
    : cache_(cache),
      prefix_(prefix),
      fingerprint_(fingerprint),
      first_kv_head_(first_kv_head),
      mover_(std::move(mover)),
      block_tokens_(size_t(cache.config().page_slots)),
      heads_(size_t(cache.config().n_layer) * size_t(cache.config().n_head_kv)) {}

// Layer 0 and the first KV head: a block holds every layer and KV head of the cache.
kvstore::BlockKey PrefixTier::block_key(uint64_t chain_key, int32_t index) const {
  return kvstore::BlockKey{fingerprint_, chain_key, 0, first_kv_head_, uint32_t(size_t(index) * block_tokens_),
                           uint32_t(block_tokens_)};
}

void PrefixTier::put(std::span<const PrefixCache::NewBlock> blocks, std::span<const int32_t> tokens) {
  if (!mover_->available()) return;  // off for good: no copy to refuse
  const size_t token_bytes = block_tokens_ * sizeof(int32_t);
  for (const PrefixCache::NewBlock& b : blocks) {
    std::vector<uint8_t> bytes(block_bytes());
    std::memcpy(bytes.data(), tokens.data() + b.first, token_bytes);
    for (size_t h = 0; h < heads_; ++h) {
      std::memcpy(bytes.data() + token_bytes + h * cache_.page_bytes(), cache_.page_data(b.pages[h]),
                  cache_.page_bytes());
    }
    const int32_t index = b.first / int32_t(block_tokens_);
    // Refused (the queue is full): the next publish of the prompt offers it again.
    if (!mover_->put(block_key(b.key, index), std::move(bytes), {kPromptBlockReuseSteps, /*shared=*/true})) return;
    prefix_.mark_exported(b.key);
  }
}

int32_t PrefixTier::fetch(std::span<const int32_t> prompt, int32_t max_tokens) {
  const int32_t wanted = std::min<int32_t>(max_tokens, int32_t(prompt.size())) / int32_t(block_tokens_);
  uint64_t parent = 0;
  const int32_t held = prefix_.stored_blocks(prompt, wanted, &parent);
  if (held >= wanted || !mover_->available()) return 0;
  const auto start = std::chrono::steady_clock::now();
  const int32_t blocks = fetch_blocks(prompt, held, wanted, parent);
  fetch_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return blocks * int32_t(block_tokens_);
}

int32_t PrefixTier::fetch_blocks(std::span<const int32_t> prompt, int32_t held, int32_t wanted, uint64_t parent) {
  const auto deadline = std::chrono::steady_clock::now() + kFetchDeadline;
  const std::vector<uint64_t> keys = prefix_.block_keys(prompt, wanted);
  std::deque<std::shared_ptr<Fetch>> queued;
  std::vector<int32_t> pages;
  int32_t index = held;
  for (int32_t next = held; index < wanted; ++index) {
    for (; next < wanted && next <= index + kBlocksAhead; ++next) {
      queued.push_back(mover_->fetch(block_key(keys[size_t(next)], next), block_bytes(), {kPromptBlockReuseSteps}));
      if (queued.back() == nullptr) return index - held;  // the tiers went off
    }
    const std::shared_ptr<Fetch> fetch = std::move(queued.front());
    queued.pop_front();
    if (!fetch->wait_until(deadline)) break;
    const auto block = prompt.subspan(size_t(index) * block_tokens_, block_tokens_);
    if (!load_block(*fetch, block, parent, pages)) break;
    std::optional<uint64_t> stored;
    try {
      stored = prefix_.insert(parent, block, pages);
    } catch (...) {
      cache_.release_pages(pages);
      throw;
    }
    if (!stored) {  // no room, or stored meanwhile
      cache_.release_pages(pages);
      break;
    }
    parent = *stored;
    fetched_bytes_ += block_bytes();
  }
  return index - held;
}

bool PrefixTier::load_block(Fetch& fetch, std::span<const int32_t> block_tokens, uint64_t parent,
                            std::vector<int32_t>& pages) {
  const size_t token_bytes = block_tokens_ * sizeof(int32_t);
  pages.clear();
  if (fetch.state() != Fetch::State::kDone || fetch.bytes().size() != block_bytes() ||
      std::memcmp(fetch.bytes().data(), block_tokens.data(), token_bytes) != 0) {
    return false;
  }
  pages.reserve(heads_);
  const auto load = [&](size_t h) {
    try {
      return cache_.load_page(std::span(fetch.bytes()).subspan(token_bytes + h * cache_.page_bytes(), cache_.page_bytes()));
    } catch (const std::exception&) {  // the pool cannot grow: as no room
      return -1;
    }
  };
  for (size_t h = 0; h < heads_; ++h) {
    int32_t page = load(h);
    // A full cache: older prompts the prefix cache keeps make room, as they would for a sequence.
    if (page < 0 && prefix_.reclaim(heads_ - h, parent) > 0) page = load(h);
    if (page < 0) {
      cache_.release_pages(pages);
      pages.clear();
      return false;
    }
    pages.push_back(page);  // reserved: does not throw
  }
  return true;
}

}  // namespace lazykv::tiers
