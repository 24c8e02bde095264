#include "worker/prefix_cache.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "common/error.h"

namespace lazykv {
namespace {

// SplitMix64's finaliser: spreads a 64-bit value over all bits.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

PrefixCache::PrefixCache(KvCache& cache, uint64_t fingerprint, size_t max_pages)
    : cache_(cache),
      fingerprint_(fingerprint),
      max_pages_(max_pages),
      block_tokens_(cache.config().page_slots),
      heads_(size_t(cache.config().n_layer) * size_t(cache.config().n_head_kv)) {}

PrefixCache::~PrefixCache() {
  for (auto& [key, entry] : entries_) cache_.release_pages(entry.pages);
}

uint64_t PrefixCache::key_of(uint64_t parent, std::span<const int32_t> tokens) const {
  uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ULL);
  for (const int32_t t : tokens) h = mix(h ^ uint32_t(t));
  return h;
}

const PrefixCache::Entry* PrefixCache::find(uint64_t parent, std::span<const int32_t> tokens, uint64_t& key) const {
  key = key_of(parent, tokens);
  const auto it = entries_.find(key);
  if (it == entries_.end() || it->second.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(), it->second.tokens.end())) {
    return nullptr;
  }
  return &it->second;
}

int32_t PrefixCache::lookup(std::span<const int32_t> prompt, int32_t max_tokens,
                            std::vector<std::vector<int32_t>>& pages) {
  pages.assign(heads_, {});
  const int32_t limit = std::min<int32_t>(max_tokens, int32_t(prompt.size()));
  const auto take = [&](uint64_t key) {
    Entry& e = entries_.at(key);
    e.used = ++tick_;
    for (size_t h = 0; h < heads_; ++h) pages[h].push_back(e.pages[h]);
  };
  const std::vector<uint64_t> chain = stored_chain(prompt, limit / block_tokens_);
  for (const uint64_t key : chain) take(key);
  const uint64_t parent = chain.empty() ? fingerprint_ : chain.back();
  const int32_t found = int32_t(chain.size()) * block_tokens_;
  // Then the longest common start of whatever was stored after them.
  const auto rest = prompt.subspan(size_t(found), size_t(std::min(limit - found, block_tokens_)));
  const auto next = next_.find(parent);
  if (rest.empty() || next == next_.end()) return found;
  uint64_t best_key = 0;
  int32_t best = 0;
  for (const uint64_t key : next->second) {
    const std::vector<int32_t>& tokens = entries_.at(key).tokens;
    const size_t n = std::min(rest.size(), tokens.size());
    const int32_t common = int32_t(std::mismatch(rest.begin(), rest.begin() + std::ptrdiff_t(n), tokens.begin()).first -
                                   rest.begin());
    if (common > best) {
      best = common;
      best_key = key;
    }
  }
  // A few tokens are not worth a page copy in every layer and head.
  if (best < std::max(1, block_tokens_ / 4)) return found;
  take(best_key);
  return found + best;
}

int32_t PrefixCache::publish(SeqId seq, std::span<const int32_t> tokens, int32_t n_tokens,
                             std::vector<NewBlock>* added) {
  const KvCacheConfig& c = cache_.config();
  if (cache_.heads_per_layer(seq) != c.n_head_kv) return 0;  // per-query-head caches are not published
  const int32_t limit = std::min<int32_t>(n_tokens, int32_t(tokens.size()));
  uint64_t parent = fingerprint_;
  int32_t stored = 0;
  while (stored < limit) {
    const int32_t len = std::min(block_tokens_, limit - stored);
    const auto block = tokens.subspan(size_t(stored), size_t(len));
    uint64_t key = 0;
    if (find(parent, block, key) != nullptr) {
      Entry& e = entries_[key];
      e.used = ++tick_;
      if (added != nullptr && len == block_tokens_ && !e.exported) added->push_back(NewBlock{key, stored, e.pages});
      parent = key;
      stored += len;
      continue;
    }
    if (entries_.count(key) != 0) break;  // another block under this key (a collision): leave it
    if (len < block_tokens_ && touch_covering_sibling(parent, block)) {
      stored += len;  // a tail another block (or tail) stored after `parent` starts with: nothing new
      break;
    }
    Entry e{parent, std::vector<int32_t>(block.begin(), block.end()), {}, ++tick_};
    e.pages.reserve(heads_);
    bool whole = true;
    for (int layer = 0; layer < c.n_layer && whole; ++layer) {
      for (int head = 0; head < c.n_head_kv && whole; ++head) {
        const auto positions = cache_.positions(seq, layer, head);
        whole = int32_t(positions.size()) >= stored + len;
        for (int32_t i = stored; whole && i < stored + len; ++i) whole = positions[size_t(i)] == i;
        if (whole) e.pages.push_back(cache_.page_ids(seq, layer, head)[size_t(stored / block_tokens_)]);
      }
    }
    if (!whole || !make_room(parent)) break;
    cache_.retain_pages(e.pages);
    if (added != nullptr && len == block_tokens_) added->push_back(NewBlock{key, stored, e.pages});
    add(key, std::move(e));
    parent = key;
    stored += len;
  }
  return stored;
}

bool PrefixCache::make_room(uint64_t parent) {
  while (pages_held_ + heads_ > max_pages_) {  // never at the new block's own chain
    const std::optional<uint64_t> victim = lru_leaf(parent, false);
    if (!victim) return false;
    drop(*victim);
  }
  return true;
}

void PrefixCache::add(uint64_t key, Entry e) {
  pages_held_ += heads_;
  next_[e.parent].push_back(key);
  entries_.emplace(key, std::move(e));
}

std::vector<uint64_t> PrefixCache::block_keys(std::span<const int32_t> tokens, int32_t n_blocks) const {
  std::vector<uint64_t> keys;
  uint64_t parent = fingerprint_;
  for (int32_t b = 0; b < n_blocks && size_t(b + 1) * size_t(block_tokens_) <= tokens.size(); ++b) {
    parent = key_of(parent, tokens.subspan(size_t(b) * size_t(block_tokens_), size_t(block_tokens_)));
    keys.push_back(parent);
  }
  return keys;
}

std::vector<uint64_t> PrefixCache::stored_chain(std::span<const int32_t> tokens, int32_t max_blocks) const {
  std::vector<uint64_t> chain;
  uint64_t parent = fingerprint_;
  for (int32_t b = 0; b < max_blocks && size_t(b + 1) * size_t(block_tokens_) <= tokens.size(); ++b) {
    uint64_t key = 0;
    if (find(parent, tokens.subspan(size_t(b) * size_t(block_tokens_), size_t(block_tokens_)), key) == nullptr) break;
    chain.push_back(key);
    parent = key;
  }
  return chain;
}

int32_t PrefixCache::stored_blocks(std::span<const int32_t> tokens, int32_t max_blocks, uint64_t* last_key) const {
  const std::vector<uint64_t> chain = stored_chain(tokens, max_blocks);
  if (last_key != nullptr) *last_key = chain.empty() ? fingerprint_ : chain.back();
  return int32_t(chain.size());
}

std::optional<uint64_t> PrefixCache::insert(uint64_t parent, std::span<const int32_t> block,
                                            std::span<const int32_t> pages) {
  if (pages.size() != heads_ || block.size() != size_t(block_tokens_) ||
      (parent != fingerprint_ && entries_.count(parent) == 0)) {
    throw Error(ErrorCode::kInvalidArgument, "prefix cache: insert of a block whose chain is not stored");
  }
  uint64_t key = 0;
  if (find(parent, block, key) != nullptr || entries_.count(key) != 0 || !make_room(parent)) return std::nullopt;
  add(key, Entry{parent, std::vector<int32_t>(block.begin(), block.end()),
                 std::vector<int32_t>(pages.begin(), pages.end()), ++tick_, /*exported=*/true});
  return key;
}

size_t PrefixCache::drop(uint64_t key) {
  const auto it = entries_.find(key);
  const Entry& e = it->second;
  const auto siblings = next_.find(e.parent);
  if (siblings != next_.end()) {
    std::erase(siblings->second, key);
    if (siblings->second.empty()) next_.erase(siblings);
  }
  size_t freed = 0;
  for (const int32_t p : e.pages) freed += cache_.page_references(p) == 1 ? 1 : 0;
  cache_.release_pages(e.pages);
  pages_held_ -= e.pages.size();
  entries_.erase(it);
  return freed;
}

std::optional<uint64_t> PrefixCache::lru_leaf(std::optional<uint64_t> keep, bool freeing) const {
  std::optional<uint64_t> oldest_key;
  uint64_t oldest = std::numeric_limits<uint64_t>::max();
  for (const auto& [key, e] : entries_) {
    if (e.used >= oldest || key == keep || next_.count(key) != 0) continue;
    if (freeing && std::none_of(e.pages.begin(), e.pages.end(),
                                [&](int32_t p) { return cache_.page_references(p) == 1; })) {
      continue;  // every page is shared with a sequence: dropping it frees nothing
    }
    {
      oldest = e.used;
      oldest_key = key;
    }
  }
  return oldest_key;
}

bool PrefixCache::touch_covering_sibling(uint64_t parent, std::span<const int32_t> tail) {
  const auto next = next_.find(parent);
  if (next == next_.end()) return false;
  for (const uint64_t key : next->second) {
    Entry& e = entries_.at(key);
    if (e.tokens.size() >= tail.size() && std::equal(tail.begin(), tail.end(), e.tokens.begin())) {
      e.used = ++tick_;
      return true;
    }
  }
  return false;
}

size_t PrefixCache::reclaimable_pages() const {
  size_t n = 0;
  for (const auto& [key, e] : entries_) {
    for (const int32_t p : e.pages) n += cache_.page_references(p) == 1 ? 1 : 0;
  }
  return n;
}

void PrefixCache::mark_exported(uint64_t key) {
  if (const auto it = entries_.find(key); it != entries_.end()) it->second.exported = true;
}

size_t PrefixCache::reclaim(size_t pages, std::optional<uint64_t> keep) {
  size_t freed = 0;
  while (freed < pages) {
    const std::optional<uint64_t> victim = lru_leaf(keep, true);
    if (!victim) break;
    freed += drop(*victim);
  }
  return freed;
}

}  // namespace lazykv
