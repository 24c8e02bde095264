// For tests: the ErrorCode a call throws (its message too), or nullopt when it
// returns normally.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/error.h"

namespace lazykv {

inline std::optional<ErrorCode> code_of(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message != nullptr) *message = e.what();
    return e.code();
  }
  return std::nullopt;
}

}  // namespace lazykv
