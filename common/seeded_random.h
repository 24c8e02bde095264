// Deterministic pseudo-random numbers (generated test and benchmark models,
// sampling, Guard's evictions): the same bits on every platform, standard
// library and thread count.
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

// The i-th output (from 0) of splitmix64 started at `seed`, without the i
// before it: a stream that resumes at any index.
inline uint64_t splitmix64_at(uint64_t seed, uint64_t i) {
  uint64_t state = seed + i * 0x9E3779B97F4A7C15ull;
  return splitmix64(state);
}

// A double in the open interval (0, 1) from 64 random bits (the top 52, plus
// a half step so that neither end is reached): its logarithm is finite.
inline double uniform_open(uint64_t bits) { return (double(bits >> 12) + 0.5) * 0x1.0p-52; }

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
