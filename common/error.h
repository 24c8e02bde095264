// Error type shared by every component. Errors are exceptions inside a
// component; service and CLI boundaries catch them and turn them into clear
// messages (or protocol errors) so one bad input never takes the process down.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace lazykv {

enum class ErrorCode {
  kInvalidArgument,  // bad user input: flags, request fields, prompt
  kInvalidModel,     // corrupt, truncated or unsupported model file
  kNotFound,         // missing file, unknown name
  kIo,               // read/write/network failure
  kOutOfMemory,      // a budget or pool is exhausted
  kUnavailable,      // the service cannot take this now: queue full, draining, worker down
  kInternal,         // a broken invariant: a bug
};

std::string_view error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Runs fn(); an Error of `code` it throws is rethrown with " (in 'where')"
// appended, so parse errors name the file they came from.
template <typename Fn>
auto with_error_context(ErrorCode code, const std::string& where, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    if (e.code() != code) throw;
    throw Error(code, std::string(e.what()) + " (in '" + where + "')");
  }
}

}  // namespace lazykv
