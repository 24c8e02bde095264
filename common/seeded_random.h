// Deterministic pseudo-random numbers for generated test and benchmark
// models: the same bits on every platform and thread count.
#pragma once

#include <cstdint>
#include <string_view>

namespace lazykv {

// SplitMix64: advances state, returns the next 64 random bits.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// FNV-1a of a name: a seed per tensor.
inline uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace lazykv
