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

struct ChatMessage {
  std::string role;
  std::string content;
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

  // The common case.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token = "", const std::string& eos_token = "") const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv
