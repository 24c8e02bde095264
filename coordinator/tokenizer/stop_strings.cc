#include "coordinator/tokenizer/stop_strings.h"

#include <algorithm>

namespace lazykv {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stops_) longest_ = std::max(longest_, s.size());
}

void StopStringMatcher::pass(std::string_view text) {
  if (stopped_ || longest_ == 0) return;
  context_.append(text);
  // Only a stop string's proper prefix can begin here and end later.
  if (context_.size() >= longest_) context_.erase(0, context_.size() - (longest_ - 1));
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  // Matches end in held_: they may begin in the context, which was emitted.
  const std::string scan = context_ + held_;
  size_t first_match = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t from = context_.size() >= s.size() ? context_.size() - (s.size() - 1) : 0;
    first_match = std::min(first_match, scan.find(s, from));
  }
  if (first_match != std::string::npos) {
    stopped_ = true;
    std::string out = first_match > context_.size() ? held_.substr(0, first_match - context_.size()) : std::string();
    held_.clear();
    context_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string
  // (of the context too, where it reaches back there).
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, scan.size()); len > hold; --len) {
      if (scan.compare(scan.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  context_.erase(0, context_.size() - (hold > held_.size() ? hold - held_.size() : 0));
  const size_t held_kept = std::min(hold, held_.size());
  std::string out = held_.substr(0, held_.size() - held_kept);
  held_.erase(0, held_.size() - held_kept);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

}  // namespace lazykv
