// libFuzzer target: tokenizer input. Arbitrary bytes (including invalid
// UTF-8) are encoded with the tiny byte-level vocabulary, special tokens on;
// encoding must not fail, every id must be in the vocabulary, and for valid
// UTF-8 input decode(encode(x)) must give x back.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "coordinator/tokenizer/tokenizer.h"
#include "worker/format/tiny_model.h"

namespace {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const lazykv::Tokenizer tokenizer(lazykv::tiny_tokenizer_spec(lazykv::TinyModelSpec{}));
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tokenizer.encode(text, /*parse_special=*/true);
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer.n_vocab()) std::abort();
  }
  if (valid_utf8(text) && tokenizer.decode(ids) != text) std::abort();
  lazykv::StreamDecoder stream(tokenizer, /*skip_special=*/false);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  if (valid_utf8(text) && streamed != text) std::abort();
  return 0;
}
