#include "common/quote.h"

#include "common/utf8.h"

namespace lazykv {
namespace {

// Code points shown escaped although valid: C1 controls (a terminal may read
// U+009B as CSI), line and paragraph separators (a log viewer breaks the
// line), bidirectional embeddings, overrides and isolates (they reorder what
// follows on screen).
bool is_unsafe(char32_t c) {
  return (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || (c >= 0x202A && c <= 0x202E) ||
         (c >= 0x2066 && c <= 0x2069);
}

char32_t decode(std::string_view sequence) {
  const auto byte = [&](size_t i) { return char32_t(static_cast<unsigned char>(sequence[i])); };
  switch (sequence.size()) {
    case 2: return (byte(0) & 0x1F) << 6 | (byte(1) & 0x3F);
    case 3: return (byte(0) & 0x0F) << 12 | (byte(1) & 0x3F) << 6 | (byte(2) & 0x3F);
    default: return (byte(0) & 0x07) << 18 | (byte(1) & 0x3F) << 12 | (byte(2) & 0x3F) << 6 | (byte(3) & 0x3F);
  }
}

void append_escaped(std::string& out, std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 0xF];
  }
}

}  // namespace

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const utf8::Sequence next = utf8::next_sequence(text.substr(pos));
    if (pos + next.length > max_bytes) break;
    const std::string_view bytes = text.substr(pos, next.length);
    pos += next.length;
    if (next.status != utf8::SequenceStatus::kValid) {
      append_escaped(out, bytes);
    } else if (bytes.size() == 1) {
      const auto b = static_cast<unsigned char>(bytes[0]);
      if (b < 0x20 || b == 0x7F) {
        append_escaped(out, bytes);
      } else {
        out += bytes[0];
      }
    } else if (is_unsafe(decode(bytes))) {
      append_escaped(out, bytes);
    } else {
      out += bytes;
    }
  }
  if (pos < text.size()) out += "...";
  return out;
}

std::string quote(std::string_view text, size_t max_bytes) {
  std::string out = "'";
  out += printable(text, max_bytes);
  out += '\'';
  return out;
}

}  // namespace lazykv
