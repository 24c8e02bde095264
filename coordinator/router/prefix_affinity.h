// Which replica served a prompt's leading bytes recently. The router has no
// tokenizer, so a prompt's prefix is a chain of hashes over fixed blocks of
// its request text (the chat messages or the completion prompt, as JSON):
// block i's key hashes blocks 0..i, so two prompts share key i exactly when
// they share their first i+1 blocks (up to hash collisions, which only cost
// a cache miss on the replica). A bounded LRU table maps each key to the
// replica it was last sent to; it is the router's only state, so any router
// of several can rebuild it from traffic.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lazykv::router {

inline constexpr size_t kPrefixBlockBytes = 256;  // ~64 tokens of English text
inline constexpr size_t kMaxPrefixBlocks = 64;    // keys per request; later bytes are not looked at

// The chain keys of `text`'s whole blocks (a partial last block has none),
// seeded with `model` so that two models never share a key.
std::vector<uint64_t> prefix_keys(std::string_view model, std::string_view text);

class PrefixAffinity {
 public:
  using Clock = std::chrono::steady_clock;
  // Keeps at most `capacity` keys; a key older than `ttl` is not used.
  PrefixAffinity(size_t capacity, std::chrono::milliseconds ttl);

  struct Match {
    int replica = -1;   // -1: no key of the request is known
    size_t blocks = 0;  // how many leading blocks matched
  };
  // The replica of the longest known prefix of `keys` for which `usable`
  // holds (a replica that is down is skipped, and a shorter prefix tried).
  template <class Usable>
  Match longest(const std::vector<uint64_t>& keys, Clock::time_point now, Usable usable) const;

  // Records that `replica` now holds every key of `keys`. With
  // `keep_known`, a key already held (within its ttl) keeps its replica: a
  // request that spilled over to another replica does not move its
  // prefix's home.
  void record(const std::vector<uint64_t>& keys, int replica, Clock::time_point now, bool keep_known = false);

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    int replica;
    Clock::time_point used;
    std::list<uint64_t>::iterator lru;  // position in lru_ (front: most recent)
  };
  size_t capacity_;
  std::chrono::milliseconds ttl_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;
};

template <class Usable>
PrefixAffinity::Match PrefixAffinity::longest(const std::vector<uint64_t>& keys, Clock::time_point now,
                                              Usable usable) const {
  for (size_t i = keys.size(); i-- > 0;) {
    const auto it = entries_.find(keys[i]);
    if (it == entries_.end() || now - it->second.used > ttl_ || !usable(it->second.replica)) continue;
    return {it->second.replica, i + 1};
  }
  return {};
}

}  // namespace lazykv::router
