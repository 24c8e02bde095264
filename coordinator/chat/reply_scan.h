// Scanning a model's reply as it streams in pieces, for the reasoning
// splitter and the tool-call reader: blank space around markers, and a tail
// that may be the start of a marker ("<think>", "<tool_call>") the next
// piece completes, which is held back.
#pragma once

#include <algorithm>
#include <string_view>

namespace lazykv {

inline bool is_reply_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// `text` without blank space at either end.
inline std::string_view trim_reply_space(std::string_view text) {
  while (!text.empty() && is_reply_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_reply_space(text.back())) text.remove_suffix(1);
  return text;
}

// JSON text read byte by byte: how many brackets are open outside strings.
struct JsonNesting {
  int depth = 0;
  bool in_string = false, escaped = false;
  void take(char c) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  bool at_top() const { return depth == 0 && !in_string; }
};

// The length of the longest end of `text` that `marker` starts with (shorter than the marker).
inline size_t marker_prefix_at_end(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace lazykv
