// The chain hash is FNV-1a over each block, folded with the previous key:
// not cryptographic (a collision costs one cache miss, nothing else).
#include "coordinator/router/prefix_affinity.h"

#include <algorithm>

namespace lazykv::router {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

uint64_t fnv1a(std::string_view bytes, uint64_t hash) {
  for (const char c : bytes) {
    hash ^= uint8_t(c);
    hash *= kFnvPrime;
  }
  return hash;
}

}  // namespace

std::vector<uint64_t> prefix_keys(std::string_view model, std::string_view text) {
  const size_t n_blocks = std::min(text.size() / kPrefixBlockBytes, kMaxPrefixBlocks);
  std::vector<uint64_t> keys(n_blocks);
  uint64_t chain = fnv1a(model, kFnvOffset);
  for (size_t i = 0; i < n_blocks; ++i) {
    chain = fnv1a(text.substr(i * kPrefixBlockBytes, kPrefixBlockBytes), chain ^ (i + 1) * kFnvPrime);
    keys[i] = chain;
  }
  return keys;
}

PrefixAffinity::PrefixAffinity(size_t capacity, std::chrono::milliseconds ttl)
    : capacity_(std::max<size_t>(capacity, 1)), ttl_(ttl) {}

void PrefixAffinity::record(const std::vector<uint64_t>& keys, int replica, Clock::time_point now, bool keep_known) {
  for (const uint64_t key : keys) {
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      if (keep_known && now - it->second.used <= ttl_) continue;
      it->second.replica = replica;
      it->second.used = now;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      continue;
    }
    if (entries_.size() == capacity_) {
      entries_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(key);
    entries_.emplace(key, Entry{replica, now, lru_.begin()});
  }
}

}  // namespace lazykv::router
