// JSON from outside (request bodies, model and tokenizer files, traces)
// parsed with a limit on nesting that holds while the parser runs: a value
// deeper than the limit is refused before it is built. nlohmann's parser is
// iterative, but copying, comparing or walking a parsed value recurses, so a
// value nested 150,000 levels deep overflows the stack later (a copy made
// when an object's member vector grows was enough).
#pragma once

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lazykv {

// Real files and requests nest under 20 levels.
inline constexpr int kMaxJsonDepth = 64;

// Thrown by parse_bounded_json for text over its limits; other faults are
// nlohmann::json::exception as from json::parse.
class JsonLimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class Json>
using JsonEventHook = std::function<void(int depth, typename Json::parse_event_t event, Json& parsed)>;

// Json::parse(text) refusing more than `max_bytes` of text and values nested
// deeper than `max_depth` (the top-level value is depth 1). `on_event`, when
// given, sees every parse event too (safetensors refuses duplicate keys).
template <class Json = nlohmann::json>
Json parse_bounded_json(std::string_view text, int max_depth = kMaxJsonDepth, size_t max_bytes = size_t(1) << 30,
                        const JsonEventHook<Json>& on_event = {}) {
  if (text.size() > max_bytes) {
    throw JsonLimitError("JSON text of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                         std::to_string(max_bytes));
  }
  // The callback's depth counts the containers open around an event: an
  // object_start at depth d opens level d + 1.
  const auto callback = [&](int depth, typename Json::parse_event_t event, Json& parsed) {
    const bool opens = event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    if (opens && depth + 1 > max_depth) {
      throw JsonLimitError("JSON nested deeper than " + std::to_string(max_depth) + " levels");
    }
    if (on_event) on_event(depth, event, parsed);
    return true;
  };
  return Json::parse(text.begin(), text.end(), callback);
}

}  // namespace lazykv
