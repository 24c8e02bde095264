// Byte-level BPE tokenizer (GPT-2 style, as used by SmolLM2, Llama-3 and
// Qwen2). Special tokens are matched first, the rest is split by the model's
// pre-tokenizer regex (PCRE2 with Unicode properties) and each piece is
// merged by rank. Encoding matches Hugging Face `tokenizers`.
//
// Special tokens are GGUF token types 3 (control: matched only when
// parse_special) and 4 (user-defined: always matched), longest match first;
// from tokenizer.json, added tokens with special=true / false. Their
// lstrip/rstrip/single_word flags are not supported (the supported models
// leave them false). Encoding is thread-safe.
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
  // Throws Error(kNotFound) for a missing file and Error(kInvalidModel) for
  // malformed JSON or an unsupported model, normalizer or pre-tokenizer.
  static TokenizerSpec spec_from_hf_json(const std::string& tokenizer_json_path);

  // parse_special: text like "<|im_start|>" becomes the special token id.
  // Does not add BOS; callers add spec().bos_id when spec().add_bos.
  // Hugging Face only encodes valid UTF-8, so invalid sequences are replaced
  // by U+FFFD first. A byte with no byte-level token in the vocabulary is
  // dropped (or becomes unk_id when the model has one), as Hugging Face does.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Concatenated raw bytes of the tokens (special tokens included as text
  // unless skip_special).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Raw bytes of one token (may be an incomplete UTF-8 sequence).
  std::string token_bytes(int32_t id) const;

  int32_t n_vocab() const;
  // Control tokens (the ones decode(skip_special) and StreamDecoder skip).
  bool is_special(int32_t id) const;
  // eos_id, spec.eog_ids, and <|im_end|>, <|endoftext|>, <|eot_id|>,
  // <|end_of_text|>, <｜end▁of▁sentence｜> when in the vocabulary.
  bool is_end_of_generation(int32_t id) const;
  // Id of an exact token text, or -1.
  int32_t find_token(std::string_view text) const;
  // The spec it was built from; eog_ids holds every end-of-generation id.
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
