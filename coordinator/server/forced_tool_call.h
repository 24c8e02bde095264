// A chat reply that must call a tool (tool_choice "required" or a named
// function): the opening written into the prompt, so the reply starts as a
// call, and the grammar the rest of the call follows, so its arguments are
// valid JSON for the function's parameter schema.
#pragma once

#include <string>

#include "coordinator/api/openai_request.h"
#include "coordinator/chat/tool_call_parser.h"
#include "coordinator/grammar/json_schema.h"

namespace lazykv {

struct ForcedToolCall {
  std::string opening;               // empty: the reply is free to call or not
  grammar::ResponseGrammar grammar;  // no schema: the call is not constrained
};

// The call's body is {"name": <one of the tools>, "arguments": <its
// parameters>} (Llama 3: "parameters"), then Hermes's closing tag. A tool
// whose parameters use a keyword the grammar cannot enforce leaves the call
// unconstrained, with the old opening (up to the name, or to the arguments
// of a named function) so it still starts as a call.
ForcedToolCall force_tool_call(ToolCallFormat format, const api::GenerationRequest& request);

}  // namespace lazykv
