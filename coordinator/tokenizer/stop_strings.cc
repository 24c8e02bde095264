#include "coordinator/tokenizer/stop_strings.h"

#include <algorithm>

namespace lazykv {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  size_t first_match = std::string::npos;
  for (const std::string& s : stops_) first_match = std::min(first_match, held_.find(s));
  if (first_match != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first_match);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

}  // namespace lazykv
