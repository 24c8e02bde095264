// UTF-8 helpers for the tokenizer, request parsing and quoting: validation
// step by step (following the Unicode "maximal subpart" rule, so each invalid
// run becomes one U+FFFD as in Python's errors="replace"), and repair of
// invalid input.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lazykv::utf8 {

enum class SequenceStatus { kValid, kIncomplete, kInvalid };

struct Sequence {
  SequenceStatus status;
  // kValid: the sequence length; kIncomplete: all remaining bytes (a valid
  // prefix cut short by the end of input); kInvalid: the bytes one U+FFFD
  // replaces (at least 1).
  size_t length;
};

// Classifies the UTF-8 sequence starting at text[0]; text must be non-empty.
Sequence next_sequence(std::string_view text);

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

bool is_valid(std::string_view text);

// Copy of text with every invalid or truncated sequence replaced by U+FFFD.
std::string repair(std::string_view text);

// Code points of valid UTF-8 (the bytes that start a sequence), as Python's
// len() of the decoded str; a sequence cut short counts once, where it starts.
size_t count_code_points(std::string_view text);

// Appends the UTF-8 encoding of a code point (assumed valid) to out.
void append_code_point(std::string& out, char32_t code_point);

}  // namespace lazykv::utf8
