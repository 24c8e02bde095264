// Prompt token ids from text or chat messages: the model's chat template
// (parsed once), special tokens parsed in rendered chat text only, and BOS
// added when the model asks for it and the text did not already start with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/chat/chat_template.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace lazykv {

class PromptEncoder {
 public:
  // Throws Error(kInvalidModel) if the model's chat template does not parse.
  explicit PromptEncoder(const Tokenizer& tokenizer);

  bool has_chat_template() const { return chat_.has_value(); }
  std::vector<int32_t> encode_text(const std::string& text) const;
  // Rendered with add_generation_prompt. Throws Error(kInvalidArgument) when
  // the model has no chat template or the template rejects the messages.
  std::vector<int32_t> encode_chat(const std::vector<ChatMessage>& messages) const;

 private:
  std::vector<int32_t> encode(const std::string& text, bool parse_special) const;
  const Tokenizer& tokenizer_;
  std::optional<ChatTemplate> chat_;
  std::string bos_text_, eos_text_;
};

}  // namespace lazykv
