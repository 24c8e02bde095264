#include "coordinator/server/prompt_encoder.h"

#include "common/error.h"

namespace lazykv {

PromptEncoder::PromptEncoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  const TokenizerSpec& spec = tokenizer.spec();
  const auto token_text = [&](int32_t id) {
    return id >= 0 && id < int32_t(spec.tokens.size()) ? tokenizer.token_bytes(id) : std::string();
  };
  bos_text_ = token_text(spec.bos_id);
  eos_text_ = token_text(spec.eos_id);
  if (!spec.chat_template.empty()) chat_.emplace(spec.chat_template);
}

std::vector<int32_t> PromptEncoder::encode(const std::string& text, bool parse_special) const {
  const TokenizerSpec& spec = tokenizer_.spec();
  std::vector<int32_t> ids = tokenizer_.encode(text, parse_special);
  if (spec.add_bos && spec.bos_id >= 0 && (ids.empty() || ids.front() != spec.bos_id)) {
    ids.insert(ids.begin(), spec.bos_id);
  }
  return ids;
}

std::vector<int32_t> PromptEncoder::encode_text(const std::string& text) const { return encode(text, false); }

std::vector<int32_t> PromptEncoder::encode_chat(const std::vector<ChatMessage>& messages) const {
  if (!chat_) throw Error(ErrorCode::kInvalidArgument, "the model has no chat template");
  return encode(chat_->render(messages, true, bos_text_, eos_text_), true);
}

}  // namespace lazykv
