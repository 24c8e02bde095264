// Prompt token ids from text or chat messages: the model's chat template
// (parsed once), and BOS added when the model asks for it and the text did not
// already start with it. Control tokens ("<|im_start|>") come only from the
// template's own text: written in a prompt or a message they are plain text,
// as OpenAI's API treats them, so a user cannot forge another role's turn.
#pragma once

#include <array>
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
  // Rendered with add_generation_prompt (and `tools`, OpenAI's array of
  // function tools, when not empty). Throws Error(kInvalidArgument) when the
  // model has no chat template or the template rejects the messages.
  std::vector<int32_t> encode_chat(const std::vector<ChatMessage>& messages,
                                   const nlohmann::ordered_json& tools = nlohmann::ordered_json::array()) const;

 private:
  std::vector<int32_t> with_bos(std::vector<int32_t> ids) const;
  // `content` with every text of message_marks_ replaced by its mark.
  std::string mark_control_text(const std::string& content) const;
  // Every string (keys too) of `value` marked.
  nlohmann::ordered_json mark_control_text(const nlohmann::ordered_json& value) const;

  const Tokenizer& tokenizer_;
  std::optional<ChatTemplate> chat_;
  std::string bos_text_, eos_text_;
  // Texts a message's content may not pass to the template as they are: the
  // control tokens' (longest first), then U+E000 (the marks' own first character).
  std::vector<std::string> message_marks_;
  std::array<bool, 256> mark_first_byte_{};
};

}  // namespace lazykv
