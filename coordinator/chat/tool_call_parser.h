// Tool calls read back from a chat reply, in the format the model's chat
// template taught it:
//   hermes  (Qwen2.5, Hermes, QwQ): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>,
//           any number, after optional text;
//   llama3  (Llama 3.1-3.3): the whole reply is {"name": ..., "parameters": {...}},
//           optionally after <|python_tag|>, several joined by ';'.
// A call whose JSON does not parse leaves the reply as plain content, as
// vLLM's parsers do. The streaming side (ToolCallHolder) passes content on
// until a call may have begun, then holds the rest for parse_tool_calls.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "coordinator/chat/chat_template.h"

namespace lazykv {

enum class ToolCallFormat { kNone, kHermes, kLlama3 };

// From the chat template source: hermes when it teaches <tool_call>, llama3
// when it teaches {"name": ..., "parameters": ...}; kNone otherwise.
ToolCallFormat tool_call_format_of_template(std::string_view template_source);

struct ParsedReply {
  std::string content;          // the text outside the calls (trimmed when there are calls)
  std::vector<ToolCall> calls;  // ids left empty; arguments as compact JSON text
};
ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view reply);

// Streams a reply's content through while it cannot be a tool call; from
// where one may begin, holds the rest (take_held() at the end).
class ToolCallHolder {
 public:
  explicit ToolCallHolder(ToolCallFormat format) : format_(format) {}
  // The part of `text` that is content for sure.
  std::string push(std::string_view text);
  // Everything held back, to be parsed once the reply is complete.
  std::string take_held();
  // Whether a call may have begun, and the text held since.
  bool holding() const { return holding_; }
  const std::string& held() const { return held_; }

 private:
  ToolCallFormat format_;
  bool holding_ = false;  // a call may have begun: all the rest is held
  std::string held_;
  bool seen_text_ = false;  // llama3: only a reply's first non-space text may open a call
};

}  // namespace lazykv
