#include "worker/policy/token_classes.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

namespace lazykv {
namespace {

// SEAL's reflection and transition thoughts, by their first words ("Wait,",
// "Let me verify", "Alternatively, ..."); a token that is one of these words
// marks its thought.
constexpr std::array<std::string_view, 9> kReflectionWords = {
    "wait", "hmm", "verify", "recheck", "double-check", "alternatively", "reconsider", "mistake", "oops"};

// The token's text written plainly: byte-level BPE's newline (U+010A) and
// space (U+0120), or SentencePiece's space (U+2581) and newline byte token.
std::string plain_text(std::string_view text, bool byte_level) {
  if (!byte_level && text == "<0x0A>") return "\n";
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (byte_level && text.compare(i, 2, "\xC4\x8A") == 0) {
      out += '\n';
      i += 2;
    } else if (byte_level && text.compare(i, 2, "\xC4\xA0") == 0) {
      out += ' ';
      i += 2;
    } else if (!byte_level && text.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 3;
    } else {
      out += text[i++];
    }
  }
  return out;
}

bool reflection_word(std::string word) {
  if (!word.empty() && word.front() == ' ') word.erase(0, 1);
  std::transform(word.begin(), word.end(), word.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return std::find(kReflectionWords.begin(), kReflectionWords.end(), word) != kReflectionWords.end();
}

}  // namespace

std::shared_ptr<const TokenClasses> classify_tokens(const std::vector<std::string>& tokens, bool byte_level) {
  auto classes = std::make_shared<TokenClasses>(tokens.size(), 0);
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string text = plain_text(tokens[id], byte_level);
    uint8_t bits = 0;
    if (text.find('\n') != std::string::npos) bits |= kSentenceEnd;
    if (text.find("\n\n") != std::string::npos) bits |= kBlankLine;
    if (!text.empty() && text.front() == '\n') bits |= kLeadingNewline;
    if (!text.empty() && text.back() == '\n') bits |= kTrailingNewline;
    if (reflection_word(text)) bits |= kReflection;
    (*classes)[id] = bits;
  }
  return classes;
}

}  // namespace lazykv
