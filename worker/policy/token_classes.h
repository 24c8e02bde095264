// What a token's text says about the structure of generated text, for the
// policies that read it (skipkv): where sentences and thoughts end, and which
// words mark a thought that re-checks or changes course instead of carrying
// the solution on. Computed once per model from its vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lazykv {

enum TokenClass : uint8_t {
  kSentenceEnd = 1,       // the text holds a newline
  kBlankLine = 2,         // ... two in a row
  kReflection = 4,        // a word of re-verification or change of course ("wait", "alternatively", ...)
  kLeadingNewline = 8,    // the text begins with a newline
  kTrailingNewline = 16,  // ... ends with one
};

// Per token id, an OR of TokenClass bits.
using TokenClasses = std::vector<uint8_t>;

// From the vocabulary's token texts: byte-level BPE (byte_level: a newline
// written U+010A, a space U+0120), else SentencePiece (a space U+2581, a
// newline the byte token "<0x0A>") or plain text.
std::shared_ptr<const TokenClasses> classify_tokens(const std::vector<std::string>& tokens, bool byte_level);

// The bits of one token (0 for an id past the table).
inline uint8_t token_class(const TokenClasses& classes, int32_t token) {
  return token >= 0 && size_t(token) < classes.size() ? classes[size_t(token)] : 0;
}

// True when a token of class `bits` ends a thought, after one of `prev_bits`:
// it holds a blank line, or the two make one (byte-level BPE writes "\n\n"
// before a word as two newline tokens).
inline bool ends_thought(uint8_t prev_bits, uint8_t bits) {
  return (bits & kBlankLine) || ((prev_bits & kTrailingNewline) && (bits & kLeadingNewline));
}

}  // namespace lazykv
