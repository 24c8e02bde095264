// A small seeded generator (SplitMix64) for Guard's random evictions: the same
// seed gives the same choices on every platform and standard library.
#pragma once

#include <cstdint>

namespace lazykv::paging {

class SeededRandom {
 public:
  explicit SeededRandom(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), bound > 0 (multiply-shift; the bias is below
  // bound / 2^64, irrelevant for cache sizes).
  uint64_t below(uint64_t bound) {
    __extension__ using Wide = unsigned __int128;  // __extension__: no -Wpedantic error
    return static_cast<uint64_t>((static_cast<Wide>(next()) * bound) >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace lazykv::paging
