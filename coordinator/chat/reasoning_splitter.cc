#include "coordinator/chat/reasoning_splitter.h"

#include <algorithm>

#include "common/error.h"
#include "coordinator/chat/reply_scan.h"

namespace lazykv {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

size_t first_non_space(std::string_view s) {
  const auto it = std::find_if_not(s.begin(), s.end(), is_reply_space);
  return size_t(it - s.begin());
}

}  // namespace

ReasoningFormat parse_reasoning_format(std::string_view name) {
  if (name == "none") return ReasoningFormat::kNone;
  if (name == "think" || name == "deepseek_r1" || name == "qwen3") return ReasoningFormat::kThink;
  throw Error(ErrorCode::kInvalidArgument, "unknown reasoning parser '" + std::string(name) +
                                               "' (known: auto, none, think; deepseek_r1 and qwen3 mean think)");
}

ReasoningFormat reasoning_format_of_template(std::string_view template_source) {
  return template_source.find(kOpen) != std::string_view::npos ? ReasoningFormat::kThink : ReasoningFormat::kNone;
}

bool prompt_opens_thinking(std::string_view prompt_text) {
  return trim_reply_space(prompt_text).ends_with(kOpen);
}

ReasoningSplitter::ReasoningSplitter(ReasoningFormat format, bool opened_by_prompt)
    : state_(format == ReasoningFormat::kNone ? State::kAnswer
             : opened_by_prompt               ? State::kThinking
                                              : State::kStart) {}

ReasoningPiece ReasoningSplitter::push(std::string_view text) {
  ReasoningPiece out;
  held_ += text;
  while (true) {
    const std::string_view held = held_;
    switch (state_) {
      case State::kStart: {
        const std::string_view rest = held.substr(first_non_space(held));
        if (rest.starts_with(kOpen)) {
          held_ = std::string(rest.substr(kOpen.size()));
          state_ = State::kThinking;
          continue;
        }
        if (rest.empty() || kOpen.starts_with(rest)) return out;  // may still open the block
        state_ = State::kAnswer;
        continue;
      }
      case State::kThinking: {
        const size_t close = held.find(kClose);
        if (close != std::string_view::npos) {
          out.reasoning += held.substr(0, close);
          held_ = std::string(held.substr(close + kClose.size()));
          state_ = State::kAnswerStart;
          continue;
        }
        const size_t keep = marker_prefix_at_end(held, kClose);
        out.reasoning += held.substr(0, held.size() - keep);
        held_ = std::string(held.substr(held.size() - keep));
        return out;
      }
      case State::kAnswerStart: {  // the blank lines between the block and the answer are neither
        const size_t start = first_non_space(held);
        held_ = std::string(held.substr(start));
        if (held_.empty()) return out;
        state_ = State::kAnswer;
        continue;
      }
      case State::kAnswer:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

ReasoningPiece ReasoningSplitter::flush() {
  ReasoningPiece out;
  if (state_ == State::kThinking) {
    out.reasoning = std::move(held_);
  } else if (state_ != State::kAnswerStart) {
    out.content = std::move(held_);
  }
  held_.clear();
  return out;
}

}  // namespace lazykv
