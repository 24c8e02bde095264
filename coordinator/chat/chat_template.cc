#include "coordinator/chat/chat_template.h"

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

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token) const {
  nlohmann::ordered_json context;
  context["messages"] = nlohmann::ordered_json::array();
  for (const ChatMessage& message : messages)
    context["messages"].push_back({{"role", message.role}, {"content", message.content}});
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token;
  context["eos_token"] = eos_token;
  return render(context);
}

}  // namespace lazykv
