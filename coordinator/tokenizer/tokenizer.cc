#include "coordinator/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>

#include "common/error.h"
#include "coordinator/tokenizer/bpe.h"
#include "coordinator/tokenizer/byte_level.h"
#include "coordinator/tokenizer/pre_tokenizer.h"
#include "common/utf8.h"

namespace lazykv {
namespace {

// GGUF token types (llama.cpp's llama_token_type).
constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeByte = 6;

// Tokens that end generation in the supported model families when present.
constexpr std::array<std::string_view, 5> kEndOfGenerationTokens = {
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",  // <｜end▁of▁sentence｜>
};

// A token matched as a whole string before pre-tokenization.
struct AddedToken {
  std::string text;
  int32_t id;
  bool special;  // control token: only matched when parse_special
};

}  // namespace

struct Tokenizer::Impl {
  TokenizerSpec spec;
  PreTokenizer pre_tokenizer;
  TokenIdMap token_ids;
  std::vector<std::string> token_bytes;  // raw bytes of each token
  std::vector<AddedToken> added;         // longest first
  std::array<bool, 256> added_first_byte{};
  BpeMerger merger;

  static PreTokenizer make_pre_tokenizer(const TokenizerSpec& spec) {
    if (spec.model != "gpt2") {
      throw Error(ErrorCode::kInvalidModel, "unsupported tokenizer model '" + spec.model +
                                                "' (supported: gpt2, byte-level BPE)");
    }
    // GGUF files without tokenizer.ggml.pre use the GPT-2 split.
    return PreTokenizer(spec.pre.empty() ? "default" : spec.pre);
  }

  static TokenIdMap make_token_ids(const TokenizerSpec& spec) {
    TokenIdMap ids;
    ids.reserve(spec.tokens.size());
    for (size_t i = 0; i < spec.tokens.size(); ++i) {
      if (!spec.tokens[i].empty()) ids.try_emplace(spec.tokens[i], static_cast<int32_t>(i));
    }
    return ids;
  }

  static const TokenizerSpec& validated(const TokenizerSpec& spec) {
    const auto n = static_cast<int64_t>(spec.tokens.size());
    if (n == 0) throw Error(ErrorCode::kInvalidModel, "tokenizer has an empty vocabulary");
    if (!spec.token_types.empty() && static_cast<int64_t>(spec.token_types.size()) != n) {
      throw Error(ErrorCode::kInvalidModel,
                  "tokenizer token_type count " + std::to_string(spec.token_types.size()) +
                      " differs from the token count " + std::to_string(n));
    }
    for (const auto& [name, id] : {std::pair{"bos", spec.bos_id}, std::pair{"eos", spec.eos_id}}) {
      if (id < -1 || id >= n) {
        throw Error(ErrorCode::kInvalidModel, std::string("tokenizer ") + name + " id " +
                                                  std::to_string(id) + " is outside the vocabulary");
      }
    }
    return spec;
  }

  explicit Impl(const TokenizerSpec& source)
      : spec(validated(source)),
        pre_tokenizer(make_pre_tokenizer(spec)),
        token_ids(make_token_ids(spec)),
        merger(token_ids, spec.merges, in_range(spec.unk_id)) {
    const auto n = static_cast<int32_t>(spec.tokens.size());
    spec.pad_id = in_range(spec.pad_id);
    spec.unk_id = in_range(spec.unk_id);

    token_bytes.resize(spec.tokens.size());
    for (int32_t id = 0; id < n; ++id) {
      const int32_t type = token_type(id);
      if (type == kTypeNormal || type == kTypeByte) {
        byte_level::decode(spec.tokens[id], token_bytes[id]);
      } else {
        token_bytes[id] = spec.tokens[id];  // control and user-defined tokens are plain text
      }
      if ((type == kTypeControl || type == kTypeUserDefined) && !spec.tokens[id].empty()) {
        added.push_back({spec.tokens[id], id, type == kTypeControl});
      }
    }
    std::stable_sort(added.begin(), added.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.text.size() > b.text.size();
    });
    for (const AddedToken& token : added) {
      added_first_byte[static_cast<unsigned char>(token.text[0])] = true;
    }

    std::vector<int32_t> eog;
    for (int32_t id : spec.eog_ids) {
      if (id >= 0 && id < n) eog.push_back(id);
    }
    if (spec.eos_id >= 0) eog.push_back(spec.eos_id);
    for (std::string_view text : kEndOfGenerationTokens) {
      const auto it = token_ids.find(text);
      if (it != token_ids.end()) eog.push_back(it->second);
    }
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    spec.eog_ids = std::move(eog);
  }

  int32_t in_range(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < spec.tokens.size() ? id : -1;
  }

  int32_t token_type(int32_t id) const {
    return spec.token_types.empty() ? kTypeNormal : spec.token_types[id];
  }

  void check_id(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= spec.tokens.size()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "token id " + std::to_string(id) + " is outside the vocabulary of " +
                      std::to_string(spec.tokens.size()));
    }
  }

  // Pre-tokenizes and merges text that holds no added tokens.
  void encode_plain(std::string_view text, BpeMerger::Scratch& scratch,
                    std::vector<std::string_view>& pieces, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string normalized;
    if (pre_tokenizer.normalizes_nfc()) {
      normalized = nfc_normalize(text);
      text = normalized;
    }
    pieces.clear();
    pre_tokenizer.split(text, pieces);
    std::string word;
    for (std::string_view piece : pieces) {
      if (pre_tokenizer.ignores_merges()) {
        word.clear();
        byte_level::encode(piece, word);
        const auto it = token_ids.find(word);
        if (it != token_ids.end()) {
          out.push_back(it->second);
          continue;
        }
      }
      merger.merge(piece, scratch, out);
    }
  }

  // The added token starting at text[pos] (the longest wins), or nullptr.
  const AddedToken* match_added(std::string_view text, size_t pos, bool parse_special) const {
    if (!added_first_byte[static_cast<unsigned char>(text[pos])]) return nullptr;
    const std::string_view rest = text.substr(pos);
    for (const AddedToken& token : added) {
      if ((!token.special || parse_special) && rest.starts_with(token.text)) return &token;
    }
    return nullptr;
  }

  std::vector<int32_t> encode(std::string_view input, bool parse_special) const {
    // Hugging Face only ever sees valid UTF-8 (a Rust &str): invalid sequences
    // are replaced by U+FFFD first.
    std::string repaired;
    std::string_view text = input;
    if (!utf8::is_valid(input)) {
      repaired = utf8::repair(input);
      text = repaired;
    }

    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    BpeMerger::Scratch scratch;
    std::vector<std::string_view> pieces;
    size_t plain_begin = 0;
    size_t pos = 0;
    while (pos < text.size()) {
      const AddedToken* token = added.empty() ? nullptr : match_added(text, pos, parse_special);
      if (token == nullptr) {
        ++pos;
        continue;
      }
      encode_plain(text.substr(plain_begin, pos - plain_begin), scratch, pieces, ids);
      ids.push_back(token->id);
      pos += token->text.size();
      plain_begin = pos;
    }
    encode_plain(text.substr(plain_begin), scratch, pieces, ids);
    return ids;
  }
};

Tokenizer::Tokenizer(const TokenizerSpec& spec) : impl_(std::make_unique<Impl>(spec)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  return impl_->encode(text, parse_special);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    impl_->check_id(id);
    if (skip_special && is_special(id)) continue;
    out += impl_->token_bytes[id];
  }
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  impl_->check_id(id);
  return impl_->token_bytes[id];
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->spec.tokens.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return impl_->in_range(id) >= 0 && impl_->token_type(id) == kTypeControl;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::binary_search(impl_->spec.eog_ids.begin(), impl_->spec.eog_ids.end(), id);
}

int32_t Tokenizer::find_token(std::string_view text) const {
  const auto it = impl_->token_ids.find(text);
  return it == impl_->token_ids.end() ? -1 : it->second;
}

const TokenizerSpec& Tokenizer::spec() const { return impl_->spec; }

}  // namespace lazykv
