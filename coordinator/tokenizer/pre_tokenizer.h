// Pre-tokenizers: split text into the pieces BPE merges within, exactly as
// Hugging Face `tokenizers` does for the supported models. A pre-tokenizer is
// a chain of regexes; each one splits every piece of the previous step, and
// both the matches and the text between matches become pieces ("Isolated").
// Regexes are PCRE2 (UTF + UCP), JIT-compiled once; splitting is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lazykv {

class PreTokenizer {
 public:
  // Throws Error(kInvalidModel) for unknown names, listing the supported ones.
  explicit PreTokenizer(const std::string& name);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  static std::vector<std::string> supported_names();

  // True when the text is NFC-normalized before splitting (Qwen2).
  bool normalizes_nfc() const { return nfc_; }
  // True when a piece that is itself a vocabulary token is taken whole
  // instead of being merged (BPE ignore_merges, Llama-3).
  bool ignores_merges() const { return ignore_merges_; }

  // Splits valid UTF-8 text into pieces (views into text), appended to out.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Regex;
  std::vector<std::unique_ptr<Regex>> chain_;
  bool nfc_ = false;
  bool ignore_merges_ = false;
};

// NFC normalization of valid UTF-8 text (utf8proc).
std::string nfc_normalize(std::string_view text);

}  // namespace lazykv
