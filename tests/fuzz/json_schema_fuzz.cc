// libFuzzer target: structured outputs compile JSON schemas from any client
// (response_format, guided_json, tool parameters) and run the matcher over
// what a model writes. The input is a schema, a NUL byte, then text: the
// schema is parsed depth-bounded as a request body is and compiled
// (lazykv::Error is the expected refusal); the text is fed byte by byte.
// A bug is a crash, a sanitizer report, a hang, another exception, a state
// past the matcher's bounds, or a text the matcher calls whole that is not
// JSON.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/bounded_json.h"
#include "common/error.h"
#include "coordinator/grammar/json_matcher.h"

namespace {

using namespace lazykv::grammar;

bool within_bounds(const MatchState& s) {
  if (s.ends.size() > kMaxStacks) return false;
  uint32_t begin = 0;
  for (uint32_t end : s.ends) {
    if (end <= begin || end - begin > uint32_t(kMaxDepth)) return false;
    begin = end;
  }
  return begin == s.frames.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view schema_text = input.substr(0, split);
  const std::string_view text = split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  nlohmann::json schema;
  try {
    schema = lazykv::parse_bounded_json(schema_text);
  } catch (const lazykv::JsonLimitError&) {
    return 0;
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  JsonSchema compiled;
  try {
    compiled = compile_json_schema(schema);
  } catch (const lazykv::Error&) {
    return 0;
  }
  const JsonMatcher matcher(std::move(compiled));
  MatchState state = matcher.start();
  MatchState next;
  size_t fed = 0;
  for (; fed < text.size(); ++fed) {
    matcher.advance(state, uint8_t(text[fed]), next);
    if (next.empty()) break;
    std::swap(state, next);
    if (!within_bounds(state)) std::abort();
  }
  if (fed == text.size() && matcher.can_end(state)) {
    // Whole by the matcher: JSON by nlohmann too.
    if (!nlohmann::json::accept(text)) std::abort();
  }
  return 0;
}
