#include "coordinator/tokenizer/byte_level.h"

#include "common/utf8.h"

namespace lazykv::byte_level {
namespace {

constexpr bool maps_to_itself(unsigned b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Alphabet {
  std::array<char32_t, 256> code_point{};
  std::array<std::string, 256> text;
  // Inverse: code point (< 0x144) -> byte, or -1.
  std::array<int, 0x144> byte_of{};

  Alphabet() {
    byte_of.fill(-1);
    char32_t next_shifted = 0x100;
    for (unsigned b = 0; b < 256; ++b) {
      code_point[b] = maps_to_itself(b) ? char32_t(b) : next_shifted++;
      utf8::append_code_point(text[b], code_point[b]);
      byte_of[code_point[b]] = static_cast<int>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

}  // namespace

const std::string& byte_to_text(unsigned char b) { return alphabet().text[b]; }

void encode(std::string_view bytes, std::string& out) {
  const Alphabet& a = alphabet();
  for (char c : bytes) out += a.text[static_cast<unsigned char>(c)];
}

void decode(std::string_view text, std::string& out) {
  const Alphabet& a = alphabet();
  size_t pos = 0;
  while (pos < text.size()) {
    const utf8::Sequence seq = utf8::next_sequence(text.substr(pos));
    if (seq.status != utf8::SequenceStatus::kValid) {  // not byte-level text
      out.append(text.substr(pos, seq.length));
      pos += seq.length;
      continue;
    }
    // Decode the code point (the alphabet only needs up to 2-byte forms).
    char32_t cp = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(text.data() + pos);
    if (seq.length == 1) cp = p[0];
    else if (seq.length == 2) cp = char32_t((p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    else cp = 0xFFFFFFFF;
    if (cp < a.byte_of.size() && a.byte_of[cp] >= 0) {
      out.push_back(static_cast<char>(a.byte_of[cp]));
    } else {
      out.append(text.substr(pos, seq.length));
    }
    pos += seq.length;
  }
}

}  // namespace lazykv::byte_level
