// libFuzzer target: `lazykv replay-policy` reads attention traces from users.
// Arbitrary bytes are parsed as JSON, depth-bounded as the command does, and
// replayed; lazykv::Error (a malformed trace or an invalid policy) is the
// expected failure, anything else (another exception, a crash, a sanitizer
// report, a hang) is a bug.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/bounded_json.h"
#include "common/error.h"
#include "worker/policy/trace_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json trace;
  try {
    trace = lazykv::parse_bounded_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const lazykv::JsonLimitError&) {
    return 0;
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  try {
    volatile size_t sink = lazykv::replay_trace(trace).dump().size();
    (void)sink;
  } catch (const lazykv::Error&) {
  }
  return 0;
}
