#include "common/utf8.h"

namespace lazykv::utf8 {

Sequence next_sequence(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {SequenceStatus::kValid, 1};

  size_t length = 0;
  // Allowed range of the second byte; later continuation bytes are 80..BF.
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;  // no overlong forms
    if (lead == 0xED) second_max = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;  // no overlong forms
    if (lead == 0xF4) second_max = 0x8F;  // nothing above U+10FFFF
  } else {
    return {SequenceStatus::kInvalid, 1};
  }

  for (size_t i = 1; i < length; ++i) {
    if (i >= text.size()) return {SequenceStatus::kIncomplete, text.size()};
    const unsigned char lo = i == 1 ? second_min : 0x80;
    const unsigned char hi = i == 1 ? second_max : 0xBF;
    if (byte(i) < lo || byte(i) > hi) return {SequenceStatus::kInvalid, i};
  }
  return {SequenceStatus::kValid, length};
}

bool is_valid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII fast path.
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Sequence seq = next_sequence(text.substr(pos));
    if (seq.status != SequenceStatus::kValid) return false;
    pos += seq.length;
  }
  return true;
}

std::string repair(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  size_t pos = 0;
  while (pos < text.size()) {
    const Sequence seq = next_sequence(text.substr(pos));
    if (seq.status == SequenceStatus::kValid) {
      out.append(text.substr(pos, seq.length));
    } else {
      out.append(kReplacementCharacter);
    }
    pos += seq.length;
  }
  return out;
}

size_t count_code_points(std::string_view text) {
  size_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // not a continuation byte
  return n;
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace lazykv::utf8
