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
  // Text emitted without looking for stop strings (before min_tokens, as
  // vLLM does), before any push: a stop string that begins in it and ends
  // in pushed text still stops generation, as vLLM finds it.
  void pass(std::string_view text);
  // True once a stop string has been seen (push returns "" afterwards).
  bool stopped() const { return stopped_; }
  // Held-back text at the end of generation (no stop string matched).
  std::string flush();

 private:
  std::vector<std::string> stops_;
  size_t longest_ = 0;
  std::string context_;  // the passed text's tail a stop string may begin in
  std::string held_;
  bool stopped_ = false;
};

}  // namespace lazykv
