#include "coordinator/grammar/token_constraint.h"

#include <algorithm>
#include <bitset>
#include <numeric>

#include "common/error.h"
#include "common/utf8.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace lazykv::grammar {
namespace {

struct PlainPrefix {
  size_t bytes = 0;
  int32_t chars = 0;
};

// The longest prefix of `text` that is plain string text: whole, valid UTF-8
// sequences without a quote, backslash or control byte.
PlainPrefix plain_prefix(const std::string& text) {
  PlainPrefix p;
  while (p.bytes < text.size()) {
    const uint8_t b = uint8_t(text[p.bytes]);
    if (b == '"' || b == '\\' || b < 0x20) break;
    const utf8::Sequence sequence = utf8::next_sequence(std::string_view(text).substr(p.bytes));
    if (sequence.status != utf8::SequenceStatus::kValid) break;
    p.bytes += sequence.length;
    ++p.chars;
  }
  return p;
}

void set_bit(TokenMask& mask, int32_t token) { mask[size_t(token) / 32] |= uint32_t(1) << (token % 32); }

}  // namespace

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer) : n_vocab_(tokenizer.n_vocab()) {
  bytes_.resize(size_t(n_vocab_));
  plain_chars_.assign(size_t(n_vocab_), kNotText);
  plain_prefix_bytes_.assign(size_t(n_vocab_), 0);
  plain_prefix_chars_.assign(size_t(n_vocab_), 0);
  std::vector<int32_t> text_tokens;
  for (int32_t t = 0; t < n_vocab_; ++t) {
    if (tokenizer.is_special(t)) continue;
    bytes_[size_t(t)] = tokenizer.token_bytes(t);
    if (bytes_[size_t(t)].empty()) continue;
    const PlainPrefix plain = plain_prefix(bytes_[size_t(t)]);
    const bool all_plain = plain.bytes == bytes_[size_t(t)].size();
    plain_chars_[size_t(t)] = all_plain ? plain.chars : kNotPlain;
    plain_prefix_bytes_[size_t(t)] = uint16_t(std::min<size_t>(plain.bytes, UINT16_MAX));
    plain_prefix_chars_[size_t(t)] = uint16_t(std::min<int32_t>(plain.chars, UINT16_MAX));
    text_tokens.push_back(t);
    max_token_bytes_ = std::max(max_token_bytes_, bytes_[size_t(t)].size());
  }
  std::sort(text_tokens.begin(), text_tokens.end(),
            [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)] || (bytes_[size_t(a)] == bytes_[size_t(b)] && a < b); });
  sorted_tokens_ = text_tokens;
  // Sorted texts make the trie in one pass: each text shares a path with the
  // one before it as far as their common prefix, and children arrive in byte order.
  trie_.emplace_back();
  std::vector<int32_t> path = {0};     // the nodes of the last text's bytes
  std::vector<int32_t> last_child = {-1};
  const std::string* previous = nullptr;
  for (size_t i = 0; i < sorted_tokens_.size(); ++i) {
    const std::string& text = bytes_[size_t(sorted_tokens_[i])];
    size_t common = 0;
    if (previous != nullptr) {
      while (common < previous->size() && common < text.size() && (*previous)[common] == text[common]) ++common;
    }
    path.resize(common + 1);
    last_child.resize(common + 1);
    for (size_t d = common; d < text.size(); ++d) {
      const int32_t id = int32_t(trie_.size());
      TrieNode node;
      node.byte = uint8_t(text[d]);
      node.tokens_begin = node.tokens_end = int32_t(i);
      trie_.push_back(node);
      const int32_t parent = path[d];
      if (last_child[d] < 0) trie_[size_t(parent)].first_child = id;
      else trie_[size_t(last_child[d])].next_sibling = id;
      ++trie_[size_t(parent)].children;
      last_child[d] = id;
      path.push_back(id);
      last_child.push_back(-1);
    }
    TrieNode& end = trie_[size_t(path.back())];
    if (end.tokens_end == end.tokens_begin) end.tokens_begin = int32_t(i);
    end.tokens_end = int32_t(i) + 1;
    previous = &text;
  }
}

TokenConstraint::TokenConstraint(JsonSchema schema, std::shared_ptr<const TokenVocabulary> vocabulary,
                                 std::vector<int32_t> end_tokens)
    : matcher_(std::move(schema)), vocabulary_(std::move(vocabulary)), end_tokens_(std::move(end_tokens)) {
  std::erase_if(end_tokens_, [&](int32_t t) { return t < 0 || t >= vocabulary_->n_vocab(); });
  if (end_tokens_.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "constrained decoding needs the model's end-of-generation token");
  }
}

bool TokenConstraint::is_end(int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

bool TokenConstraint::accept(MatchState& state, int32_t token) const {
  if (token < 0 || token >= vocabulary_->n_vocab()) return false;
  if (is_end(token)) return matcher_.can_end(state);
  if (!vocabulary_->is_text(token)) return false;
  return matcher_.advance(state, vocabulary_->bytes(token));
}

std::shared_ptr<const TokenMask> TokenConstraint::allowed(const MatchState& state) const {
  std::string key = state.key();
  std::lock_guard lock(mutex_);
  if (const auto it = cache_.find(key); it != cache_.end()) {
    ++stats_.hits;
    return it->second;
  }
  ++stats_.misses;
  auto mask = std::make_shared<const TokenMask>(compute(state));
  if (cache_.size() >= kMaxCachedMasks) cache_.clear();
  cache_.emplace(std::move(key), mask);
  return mask;
}

TokenConstraint::CacheStats TokenConstraint::cache_stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

TokenMask TokenConstraint::compute(const MatchState& state) const {
  TokenMask mask((size_t(vocabulary_->n_vocab()) + 31) / 32, 0);
  if (matcher_.can_end(state)) {
    for (int32_t t : end_tokens_) set_bit(mask, t);
  }
  const int64_t room = matcher_.plain_string_room(state);
  if (room >= 0) {
    admit_plain_text(state, room, mask);
    return mask;
  }
  path_.resize(vocabulary_->max_token_bytes_ + 1);
  path_[0] = state;
  walk(0, 0, mask);
  return mask;
}

void TokenConstraint::walk(int32_t node, size_t depth, TokenMask& mask) const {
  const auto& trie = vocabulary_->trie_;
  // Past this many children, 256 single-byte matches cost less than matching every child.
  constexpr int32_t kFilterChildren = 64;
  std::bitset<256> takes;
  takes.set();
  if (trie[size_t(node)].children > kFilterChildren) {
    for (int b = 0; b < 256; ++b) {
      matcher_.advance(path_[depth], uint8_t(b), path_[depth + 1]);
      takes[size_t(b)] = !path_[depth + 1].empty();
    }
  }
  for (int32_t child = trie[size_t(node)].first_child; child >= 0; child = trie[size_t(child)].next_sibling) {
    const TokenVocabulary::TrieNode& c = trie[size_t(child)];
    if (!takes[c.byte]) continue;
    MatchState& next = path_[depth + 1];
    matcher_.advance(path_[depth], c.byte, next);
    if (next.empty()) continue;
    for (int32_t i = c.tokens_begin; i < c.tokens_end; ++i) set_bit(mask, vocabulary_->sorted_tokens_[size_t(i)]);
    walk(child, depth + 1, mask);
  }
}

// Inside plain string text: plain tokens by their character count; the rest
// from the state after their plain prefix, which only counts characters.
void TokenConstraint::admit_plain_text(const MatchState& state, int64_t room, TokenMask& mask) const {
  const TokenVocabulary& v = *vocabulary_;
  std::vector<MatchState> after_prefix;  // by the prefix's characters, as far as room allows
  MatchState scratch;
  for (int32_t t = 0; t < v.n_vocab(); ++t) {
    const int32_t chars = v.plain_chars_[size_t(t)];
    if (chars == TokenVocabulary::kNotText) continue;
    if (chars >= 0) {
      if (chars <= room) set_bit(mask, t);
      continue;
    }
    const size_t prefix_chars = v.plain_prefix_chars_[size_t(t)];
    if (int64_t(prefix_chars) > room) continue;
    while (after_prefix.size() <= prefix_chars) {
      after_prefix.push_back(after_prefix.empty() ? state : matcher_.after_plain_char(after_prefix.back()));
    }
    scratch = after_prefix[prefix_chars];
    if (matcher_.advance(scratch, std::string_view(v.bytes(t)).substr(v.plain_prefix_bytes_[size_t(t)]))) {
      set_bit(mask, t);
    }
  }
}

}  // namespace lazykv::grammar
