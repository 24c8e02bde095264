// GPT-2 byte-level alphabet: every byte maps to one printable code point, so
// any byte string is a string of vocabulary characters. Printable Latin-1
// bytes map to themselves, the other 68 bytes to U+0100 upwards in byte order.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace lazykv::byte_level {

// The UTF-8 text of the code point that byte b maps to.
const std::string& byte_to_text(unsigned char b);

// Appends the byte-level form of raw bytes to out.
void encode(std::string_view bytes, std::string& out);

// Appends the raw bytes behind byte-level text to out. Code points outside
// the alphabet (not produced by encode) are copied through as UTF-8.
void decode(std::string_view text, std::string& out);

}  // namespace lazykv::byte_level
