// Text streamed in pieces may end with the start of a marker ("<think>",
// "<tool_call>") that the next piece completes; such a tail is held back.
#pragma once

#include <algorithm>
#include <string_view>

namespace lazykv {

// The length of the longest end of `text` that `marker` starts with (shorter than the marker).
inline size_t marker_prefix_at_end(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace lazykv
