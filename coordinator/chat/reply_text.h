// What a chat choice's generated text becomes as it streams: the thinking
// (reasoning_content), the answer (content) and the tool calls, by the
// formats the model's chat template implies. A completions choice uses the
// formats kNone: its text passes through as it is.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "coordinator/chat/reasoning_splitter.h"
#include "coordinator/chat/tool_call_parser.h"
#include "coordinator/chat/tool_call_stream.h"

namespace lazykv {

struct ReplyPiece {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> call_pieces;  // the calls as they stream
  std::vector<ToolCall> calls;  // only from finish(), every call; ids left empty
  int calls_streamed = 0;       // finish(): the first this-many calls began in call_pieces
};

class ReplyText {
 public:
  // forced_prefix: text the prompt already wrote into the reply (a forced
  // tool call's opening); it is part of what the tool-call parser reads.
  ReplyText(ReasoningFormat reasoning, bool prompt_opens_thinking, ToolCallFormat tools,
            std::string_view forced_prefix = "");
  ReplyPiece push(std::string_view text);
  // The reply's last text; what was held back comes out, calls parsed.
  ReplyPiece finish(std::string_view text);
  bool thinking() const { return reasoning_.thinking(); }

 private:
  ReasoningSplitter reasoning_;
  ToolCallFormat tool_format_;
  ToolCallHolder tools_;
  ToolCallStream stream_;
};

}  // namespace lazykv
