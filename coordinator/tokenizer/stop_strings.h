// Stop strings for streamed generation: text is released as soon as it can no
// longer be the start of a stop string, and generation ends at the first match
// (the stop string itself is not emitted), as OpenAI's `stop` behaves.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lazykv {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Feeds newly generated text; returns the text safe to emit now.
  std::string push(std::string_view text);
  // True once a stop string has been seen (push returns "" afterwards).
  bool stopped() const { return stopped_; }
  // Held-back text at the end of generation (no stop string matched).
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace lazykv
