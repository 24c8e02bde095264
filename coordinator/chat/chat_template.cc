#include "coordinator/chat/chat_template.h"

#include "common/bounded_json.h"
#include "coordinator/chat/jinja_interpreter.h"
#include "coordinator/chat/jinja_parser.h"

namespace lazykv {

struct ChatTemplate::Impl {
  jinja::Body program;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->program = jinja::parse_template(source);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return jinja::render(impl_->program, context);
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render(nlohmann::ordered_json(context));
}

namespace {

nlohmann::ordered_json message_object(const ChatMessage& message) {
  nlohmann::ordered_json m = {{"role", message.role}, {"content", message.content}};
  if (!message.tool_calls.empty()) {
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    for (const ToolCall& call : message.tool_calls) {
      nlohmann::ordered_json arguments = call.arguments;
      try {
        arguments = parse_bounded_json<nlohmann::ordered_json>(call.arguments);
      } catch (const std::exception&) {
        // Not JSON (a model may have written that): the template gets the text.
      }
      calls.push_back({{"id", call.id},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", std::move(arguments)}}}});
    }
    m["tool_calls"] = std::move(calls);
  }
  if (!message.tool_call_id.empty()) m["tool_call_id"] = message.tool_call_id;
  return m;
}

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token,
                                 const nlohmann::ordered_json& tools) const {
  nlohmann::ordered_json context;
  context["messages"] = nlohmann::ordered_json::array();
  for (const ChatMessage& message : messages) context["messages"].push_back(message_object(message));
  if (!tools.empty()) context["tools"] = tools;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token;
  context["eos_token"] = eos_token;
  return render(context);
}

}  // namespace lazykv
