// Renders a model's chat template: the subset of Jinja2 that model chat
// templates use (statements if/elif/else, for with loop.*, set with
// namespace(), macros; expressions with filters, tests, string and list
// methods, slicing, raise_exception). Templates are parsed once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lazykv {

// A function call an assistant turn made (OpenAI's tool_calls entry).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text, as the API carries it
};

struct ChatMessage {
  std::string role;
  std::string content;
  std::vector<ToolCall> tool_calls = {};  // assistant turns that called tools
  std::string tool_call_id = {};          // tool turns: the call this is the result of
};

class ChatTemplate {
 public:
  // Throws Error(kInvalidModel) with line/column on a syntax error.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // context holds the template variables (messages, add_generation_prompt,
  // bos_token, eos_token, tools, ...). Throws Error(kInvalidArgument) for a
  // runtime error, including raise_exception() from the template.
  std::string render(const nlohmann::json& context) const;
  // Same, keeping the context's key order: tojson prints objects (tool
  // schemas, tool-call arguments) in that order, as Python dicts do, so
  // callers that parsed request JSON should pass ordered_json to match.
  std::string render(const nlohmann::ordered_json& context) const;

  // The common case. Tool calls reach the template as transformers passes
  // them: {"id", "type": "function", "function": {"name", "arguments"}} with
  // the arguments parsed into an object (a string when they do not parse);
  // `tools` (OpenAI's array of function tools) is set only when not empty.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token = "", const std::string& eos_token = "",
                     const nlohmann::ordered_json& tools = nlohmann::ordered_json::array()) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv
