// The bounds of a request's sampling parameters. The API refuses values
// outside them with a 400 naming the field; the worker checks them again,
// since it also serves coordinators started apart from it. Both read them
// from here, so the two cannot drift apart.
#pragma once

#include <cstddef>

namespace lazykv::sampling_limits {

inline constexpr double kMaxAbsPenalty = 2;            // presence and frequency penalties: [-2, 2]
inline constexpr double kMinRepetitionPenalty = 0.01;  // below it a seen logit divided by it overflows float
inline constexpr double kMaxRepetitionPenalty = 100;
inline constexpr double kMaxAbsLogitBias = 100;        // each bias in [-100, 100]
inline constexpr size_t kMaxLogitBiasEntries = 1024;

}  // namespace lazykv::sampling_limits
