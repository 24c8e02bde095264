#include "coordinator/chat/reply_text.h"

namespace lazykv {

ReplyText::ReplyText(ReasoningFormat reasoning, bool prompt_opens_thinking, ToolCallFormat tools,
                     std::string_view forced_prefix)
    : reasoning_(reasoning, prompt_opens_thinking), tool_format_(tools), tools_(tools), stream_(tools) {
  tools_.push(forced_prefix);  // held: a forced prefix opens a call
}

ReplyPiece ReplyText::push(std::string_view text) {
  ReasoningPiece split = reasoning_.push(text);
  ReplyPiece out{std::move(split.reasoning), tools_.push(split.content), {}, {}, 0};
  if (tools_.holding()) out.call_pieces = stream_.push(tools_.held());
  return out;
}

ReplyPiece ReplyText::finish(std::string_view text) {
  ReplyPiece out = push(text);
  ReasoningPiece rest = reasoning_.flush();
  out.reasoning += rest.reasoning;
  out.content += tools_.push(rest.content);
  if (tools_.holding()) {
    std::vector<ToolCallDelta> last = stream_.push(tools_.held());
    out.call_pieces.insert(out.call_pieces.end(), last.begin(), last.end());
  }
  ParsedReply parsed = parse_tool_calls(tool_format_, tools_.take_held());
  out.content += parsed.content;
  out.calls = std::move(parsed.calls);
  out.calls_streamed = out.calls.empty() ? 0 : stream_.calls_started();
  return out;
}

}  // namespace lazykv
