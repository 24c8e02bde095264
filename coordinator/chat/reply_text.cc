#include "coordinator/chat/reply_text.h"

namespace lazykv {

ReplyText::ReplyText(ReasoningFormat reasoning, bool prompt_opens_thinking, ToolCallFormat tools,
                     std::string_view forced_prefix)
    : reasoning_(reasoning, prompt_opens_thinking), tool_format_(tools), tools_(tools) {
  tools_.push(forced_prefix);  // held: a forced prefix opens a call
}

ReplyPiece ReplyText::push(std::string_view text) {
  ReasoningPiece split = reasoning_.push(text);
  return {std::move(split.reasoning), tools_.push(split.content), {}};
}

ReplyPiece ReplyText::finish(std::string_view text) {
  ReplyPiece out = push(text);
  ReasoningPiece rest = reasoning_.flush();
  out.reasoning += rest.reasoning;
  out.content += tools_.push(rest.content);
  ParsedReply parsed = parse_tool_calls(tool_format_, tools_.take_held());
  out.content += parsed.content;
  out.calls = std::move(parsed.calls);
  return out;
}

}  // namespace lazykv
