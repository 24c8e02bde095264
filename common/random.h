// Random 64-bit values for ids and default seeds (a response id, a process's
// instance id, a coordinator's session, a request's sampling seed). Not for
// secrets: the generator is a Mersenne Twister seeded once per thread from
// std::random_device.
#pragma once

#include <cstdint>

namespace lazykv {

uint64_t random_u64();

}  // namespace lazykv
