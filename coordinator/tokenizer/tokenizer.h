// Byte-level BPE tokenizer (GPT-2 style, as used by SmolLM2, Llama-3 and
// Qwen2). Special tokens are matched first, the rest is split by the model's
// pre-tokenizer regex (PCRE2 with Unicode properties) and each piece is
// merged by rank. Encoding matches Hugging Face `tokenizers`.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer_spec.h"

namespace lazykv {

class Tokenizer {
 public:
  // Throws Error(kInvalidModel) for unsupported models or pre-tokenizers.
  explicit Tokenizer(const TokenizerSpec& spec);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Reads a Hugging Face tokenizer.json (+ tokenizer_config.json beside it for
  // the chat template and bos/eos, when present).
  static TokenizerSpec spec_from_hf_json(const std::string& tokenizer_json_path);

  // parse_special: text like "<|im_start|>" becomes the special token id.
  // Does not add BOS; callers add spec().bos_id when spec().add_bos.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Concatenated raw bytes of the tokens (special tokens included as text
  // unless skip_special).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Raw bytes of one token (may be an incomplete UTF-8 sequence).
  std::string token_bytes(int32_t id) const;

  int32_t n_vocab() const;
  bool is_special(int32_t id) const;
  bool is_end_of_generation(int32_t id) const;
  // Id of an exact token text, or -1.
  int32_t find_token(std::string_view text) const;
  const TokenizerSpec& spec() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into valid UTF-8 text chunks: bytes of an
// incomplete UTF-8 sequence are held back until the sequence completes.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // Returns the text that became complete with this token (may be empty).
  std::string push(int32_t id);
  // Returns held-back bytes at the end of a stream (invalid sequences become U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace lazykv
