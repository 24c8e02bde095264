// A small seeded generator (SplitMix64) for Guard's random evictions: the same
// seed gives the same choices on every platform and standard library.
#pragma once

#include <cstdint>

#include "common/seeded_random.h"

namespace lazykv::paging {

class SeededRandom {
 public:
  explicit SeededRandom(uint64_t seed) : state_(seed) {}

  uint64_t next() { return splitmix64(state_); }
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
