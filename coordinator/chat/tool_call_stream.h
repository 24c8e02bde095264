// Tool calls streamed as they are written: a call's name as soon as it is
// complete, then its arguments' JSON text piece by piece, as OpenAI streams
// delta.tool_calls. It reads the text ToolCallHolder holds (from where a call
// may begin) and follows the form models write, in either format:
//   hermes  <tool_call> {"name": "...", "arguments": {...}} </tool_call>, repeated;
//   llama3  [<|python_tag|>] {"name": "...", "parameters": {...}}, joined by ';'
// (either key in either format, blank space anywhere between). Text that
// leaves that form (keys in another order, a name with escapes, content
// between calls) stops the stream: the calls not yet begun then arrive
// whole when the reply ends, parsed from the whole text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "coordinator/chat/reply_scan.h"
#include "coordinator/chat/tool_call_parser.h"

namespace lazykv {

// One streamed piece of a call; the first piece of each call has its name
// (and, once the server gives it one, its id).
struct ToolCallDelta {
  int index = 0;          // the call's place in the reply
  std::string name;       // first piece only
  std::string id;         // first piece only
  std::string arguments;  // the next piece of the arguments' JSON text
};

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}
  // `held`: all the text held so far (it only grows); the pieces it adds.
  std::vector<ToolCallDelta> push(std::string_view held);
  // Calls whose name was streamed: the rest of the reply's calls are sent whole.
  int calls_started() const { return calls_started_; }

 private:
  enum class Step { kOpen, kBrace, kNameKey, kNameColon, kNameQuote, kName, kComma, kArgsKey, kArgsColon,
                    kArgs, kCloseBrace, kAfterCall, kStopped };
  // Matches `b` against the literal the step expects; true when it completes.
  bool literal(uint8_t b, std::string_view expected);
  void take(uint8_t b, std::vector<ToolCallDelta>& out);
  void stop() { step_ = Step::kStopped; }

  ToolCallFormat format_;
  size_t read_ = 0;  // bytes of the held text consumed
  Step step_ = Step::kOpen;
  size_t matched_ = 0;    // bytes of the current literal matched
  std::string token_;     // the name, or the arguments' key, so far
  JsonNesting arguments_;  // the arguments' brackets open
  int calls_started_ = 0;
};

}  // namespace lazykv
