// libFuzzer target: `lazykv replay-policy` reads attention traces from users.
// Arbitrary bytes are parsed as JSON and replayed; lazykv::Error (a malformed
// trace or an invalid policy) is the expected failure, anything else (another
// exception, a crash, a sanitizer report, a hang) is a bug.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "worker/policy/trace_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json trace = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (trace.is_discarded()) return 0;
  try {
    volatile size_t sink = lazykv::replay_trace(trace).dump().size();
    (void)sink;
  } catch (const lazykv::Error&) {
  }
  return 0;
}
