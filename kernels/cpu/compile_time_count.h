// A run-time count handed to a kernel as a compile-time constant, so its
// loops over tokens unroll and its accumulators stay in registers. Internal
// to kernels/cpu.
#pragma once

#include <algorithm>
#include <type_traits>
#include <utility>

namespace lazykv::cpu {

// Calls f(std::integral_constant<int, n>) with n = count clamped to [1, kMax].
template <int kMax, typename F>
void with_compile_time_count(int count, F&& f) {
  const int n = std::clamp(count, 1, kMax);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (void)((n == I + 1 ? (f(std::integral_constant<int, I + 1>{}), true) : false) || ...);
  }(std::make_integer_sequence<int, kMax>{});
}

}  // namespace lazykv::cpu
