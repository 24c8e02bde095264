// A reasoning model's chat reply split into its thinking and its answer, as
// the text streams in: DeepSeek-R1 and Qwen3 think between <think> and
// </think>, and the API returns that part as `reasoning_content`. The block
// is open when the reply starts with <think> (whitespace before it aside) or
// when the prompt already opened it (R1's templates end the generation
// prompt with "<think>\n"); a reply whose block never closes is all
// thinking. Text that may be the start of a marker is held back until the
// next piece (or flush) tells.
#pragma once

#include <string>
#include <string_view>

namespace lazykv {

enum class ReasoningFormat {
  kNone,   // no split: everything is content
  kThink,  // <think> ... </think>
};

// "none", "think", and vLLM's parser names for the same format ("deepseek_r1",
// "qwen3"); Error(kInvalidArgument) listing them otherwise. "auto" is
// resolved by the caller (reasoning_format_of_template).
ReasoningFormat parse_reasoning_format(std::string_view name);
// kThink when the chat template source mentions <think>, kNone otherwise.
ReasoningFormat reasoning_format_of_template(std::string_view template_source);
// Whether a rendered prompt ends inside an open thinking block.
bool prompt_opens_thinking(std::string_view prompt_text);

struct ReasoningPiece {
  std::string reasoning;
  std::string content;
};

class ReasoningSplitter {
 public:
  ReasoningSplitter(ReasoningFormat format, bool opened_by_prompt);
  ReasoningPiece push(std::string_view text);
  // The end of the reply: what was held back, as what it would have been.
  ReasoningPiece flush();
  // Inside the thinking block now (text pushed next is thinking, unless it closes the block).
  bool thinking() const { return state_ == State::kThinking; }

 private:
  enum class State { kStart, kThinking, kAnswerStart, kAnswer };
  State state_;
  std::string held_;
};

}  // namespace lazykv
