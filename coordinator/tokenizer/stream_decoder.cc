// StreamDecoder: emits only complete UTF-8, holding back a sequence that a
// later token may finish (byte-level tokens often split multi-byte characters).
#include "coordinator/tokenizer/tokenizer.h"
#include "common/utf8.h"

namespace lazykv {

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);

  std::string ready;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const utf8::Sequence seq = utf8::next_sequence(std::string_view(pending_).substr(pos));
    if (seq.status == utf8::SequenceStatus::kIncomplete) break;  // wait for more bytes
    if (seq.status == utf8::SequenceStatus::kValid) {
      ready.append(pending_, pos, seq.length);
    } else {
      ready.append(utf8::kReplacementCharacter);
    }
    pos += seq.length;
  }
  pending_.erase(0, pos);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest = utf8::repair(pending_);
  pending_.clear();
  return rest;
}

}  // namespace lazykv
