#include "coordinator/server/prompt_encoder.h"

#include <algorithm>
#include <charconv>

#include "common/error.h"

namespace lazykv {

namespace {

// Private-use code points that stand, in a rendered chat, for a control
// token's text that a message held: U+E000, the text's index in decimal, U+E001.
constexpr std::string_view kMarkOpen = "\xEE\x80\x80";   // U+E000
constexpr std::string_view kMarkClose = "\xEE\x80\x81";  // U+E001

void append(std::vector<int32_t>& ids, const std::vector<int32_t>& more) { ids.insert(ids.end(), more.begin(), more.end()); }

}  // namespace

PromptEncoder::PromptEncoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  const TokenizerSpec& spec = tokenizer.spec();
  const auto token_text = [&](int32_t id) {
    return id >= 0 && id < int32_t(spec.tokens.size()) ? tokenizer.token_bytes(id) : std::string();
  };
  bos_text_ = token_text(spec.bos_id);
  eos_text_ = token_text(spec.eos_id);
  if (!spec.chat_template.empty()) chat_.emplace(spec.chat_template);
  for (int32_t id = 0; id < tokenizer.n_vocab(); ++id) {
    if (!tokenizer.is_special(id)) continue;
    std::string text = tokenizer.token_bytes(id);
    if (!text.empty()) message_marks_.push_back(std::move(text));
  }
  // Longest first: the tokenizer matches "<|im_start|>" before any shorter prefix of it.
  std::stable_sort(message_marks_.begin(), message_marks_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  message_marks_.emplace_back(kMarkOpen);  // a U+E000 of the message itself
  for (const std::string& text : message_marks_) mark_first_byte_[static_cast<unsigned char>(text[0])] = true;
}

std::vector<int32_t> PromptEncoder::with_bos(std::vector<int32_t> ids) const {
  const TokenizerSpec& spec = tokenizer_.spec();
  if (spec.add_bos && spec.bos_id >= 0 && (ids.empty() || ids.front() != spec.bos_id)) {
    ids.insert(ids.begin(), spec.bos_id);
  }
  return ids;
}

std::vector<int32_t> PromptEncoder::encode_text(const std::string& text) const {
  return with_bos(tokenizer_.encode(text, false));
}

std::string PromptEncoder::mark_control_text(const std::string& content) const {
  std::string out;
  size_t plain = 0;
  for (size_t pos = 0; pos < content.size();) {
    if (!mark_first_byte_[static_cast<unsigned char>(content[pos])]) {
      ++pos;
      continue;
    }
    const std::string_view rest = std::string_view(content).substr(pos);
    const auto found = std::find_if(message_marks_.begin(), message_marks_.end(),
                                    [&](const std::string& text) { return rest.starts_with(text); });
    if (found == message_marks_.end()) {
      ++pos;
      continue;
    }
    out.append(content, plain, pos - plain);
    out += kMarkOpen;
    out += std::to_string(found - message_marks_.begin());
    out += kMarkClose;
    pos += found->size();
    plain = pos;
  }
  if (plain == 0) return content;
  out.append(content, plain);
  return out;
}

nlohmann::ordered_json PromptEncoder::mark_control_text(const nlohmann::ordered_json& value) const {
  if (value.is_string()) return mark_control_text(value.get_ref<const std::string&>());
  if (value.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& item : value) out.push_back(mark_control_text(item));
    return out;
  }
  if (value.is_object()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const auto& [key, item] : value.items()) out[mark_control_text(key)] = mark_control_text(item);
    return out;
  }
  return value;
}

std::vector<int32_t> PromptEncoder::encode_chat(const std::vector<ChatMessage>& messages,
                                                const nlohmann::ordered_json& tools) const {
  if (!chat_) throw Error(ErrorCode::kInvalidArgument, "the model has no chat template");
  // The template's own text may hold control tokens ("<|im_start|>"); a
  // message's may not, or a user could write turns of other roles. So the
  // messages' control texts are rendered as marks, and each becomes the
  // plain-text tokens of what it stands for.
  std::vector<ChatMessage> marked = messages;
  for (ChatMessage& m : marked) {
    m.content = mark_control_text(m.content);
    m.tool_call_id = mark_control_text(m.tool_call_id);
    for (ToolCall& call : m.tool_calls) {
      call.id = mark_control_text(call.id);
      call.arguments = mark_control_text(call.arguments);  // names are [A-Za-z0-9_-]
    }
  }
  const std::string rendered = chat_->render(marked, true, bos_text_, eos_text_, mark_control_text(tools));
  const std::string_view text = rendered;
  std::vector<int32_t> ids;
  size_t pos = 0;
  for (;;) {
    const size_t open = text.find(kMarkOpen, pos);
    append(ids, tokenizer_.encode(text.substr(pos, open == std::string_view::npos ? open : open - pos), true));
    if (open == std::string_view::npos) break;
    const size_t digits = open + kMarkOpen.size();
    const size_t close = text.find(kMarkClose, digits);
    size_t index = message_marks_.size();
    if (close != std::string_view::npos && close > digits) {
      const auto [end, ec] = std::from_chars(text.data() + digits, text.data() + close, index);
      if (ec != std::errc() || end != text.data() + close) index = message_marks_.size();
    }
    if (index < message_marks_.size()) {
      append(ids, tokenizer_.encode(message_marks_[index], false));
      pos = close + kMarkClose.size();
    } else {  // not a mark (the template wrote a U+E000): text
      append(ids, tokenizer_.encode(kMarkOpen, false));
      pos = digits;
    }
  }
  return with_bos(std::move(ids));
}

}  // namespace lazykv
