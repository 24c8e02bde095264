#include "common/random.h"

#include <random>

namespace lazykv {

uint64_t random_u64() {
  thread_local std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
  return rng();
}

}  // namespace lazykv
