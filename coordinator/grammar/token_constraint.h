// Constrained decoding at the token level: which tokens of the vocabulary
// may come next so that the output stays a prefix of the grammar's language
// (json_matcher.h), as a bitset the worker applies before sampling.
//
// How the mask stays cheap (docs/serving.md has the measurement):
// - The vocabulary's text tokens sit in a byte trie, built once per
//   tokenizer; a mask walks it depth first from the current state, so
//   tokens sharing a prefix share its matching, and a refused byte prunes
//   its whole subtree (outside strings almost everything is pruned at the
//   first byte).
// - A node with many children (after a space, most of a BPE vocabulary)
//   first asks the state which of the 256 bytes it takes, and skips the
//   children the state refuses without matching them.
// - Inside a string's plain text a token of plain text is admitted by its
//   character count alone, with no walk; only the tokens holding a quote,
//   backslash, control byte or partial UTF-8 sequence are matched.
// - Masks are cached by matcher state. A string's characters leave its
//   state unchanged where no length limit tells them apart, so most steps
//   of a structured output find their mask in the cache.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/grammar/json_matcher.h"

namespace lazykv {
class Tokenizer;
}

namespace lazykv::grammar {

using TokenMask = std::vector<uint32_t>;  // bit t of word t / 32: token t is allowed

class TokenVocabulary {
 public:
  // Control tokens and tokens without text are never in a mask (the end
  // tokens are added by the constraint when the grammar may end).
  explicit TokenVocabulary(const Tokenizer& tokenizer);

  int32_t n_vocab() const { return n_vocab_; }
  const std::string& bytes(int32_t token) const { return bytes_[size_t(token)]; }
  bool is_text(int32_t token) const { return plain_chars_[size_t(token)] != kNotText; }

 private:
  friend class TokenConstraint;
  static constexpr int32_t kNotText = -2;
  static constexpr int32_t kNotPlain = -1;
  struct TrieNode {
    int32_t first_child = -1;
    int32_t next_sibling = -1;
    int32_t tokens_begin = 0, tokens_end = 0;  // the tokens whose text ends here, in sorted_tokens_
    int32_t children = 0;
    uint8_t byte = 0;
  };
  int32_t n_vocab_ = 0;
  std::vector<std::string> bytes_;
  // Characters of a token of plain string text (valid whole UTF-8, no quote,
  // backslash or control byte); kNotPlain for other text; kNotText.
  std::vector<int32_t> plain_chars_;
  // Other text: how many leading bytes, and characters, are plain.
  std::vector<uint16_t> plain_prefix_bytes_, plain_prefix_chars_;
  std::vector<TrieNode> trie_;  // trie_[0]: the root (empty prefix)
  std::vector<int32_t> sorted_tokens_;
  size_t max_token_bytes_ = 0;
};

class TokenConstraint {
 public:
  TokenConstraint(JsonSchema schema, std::shared_ptr<const TokenVocabulary> vocabulary,
                  std::vector<int32_t> end_tokens);

  MatchState start() const { return matcher_.start(); }
  // Feeds a sampled token: false when the mask would not have allowed it.
  // An end token is allowed where the grammar may end; it leaves the state as it was.
  bool accept(MatchState& state, int32_t token) const;
  // The tokens allowed after `state`: never empty while the output is
  // unfinished (an end token is in it once the grammar can end).
  std::shared_ptr<const TokenMask> allowed(const MatchState& state) const;
  int32_t n_vocab() const { return vocabulary_->n_vocab(); }
  const JsonMatcher& matcher() const { return matcher_; }

  struct CacheStats {
    int64_t hits = 0, misses = 0;
  };
  CacheStats cache_stats() const;

 private:
  TokenMask compute(const MatchState& state) const;
  void walk(int32_t node, size_t depth, TokenMask& mask) const;
  void admit_plain_text(const MatchState& state, int64_t room, TokenMask& mask) const;
  bool is_end(int32_t token) const;

  JsonMatcher matcher_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<int32_t> end_tokens_;

  mutable std::mutex mutex_;  // guards what follows
  mutable std::vector<MatchState> path_;  // walk(): the state after each depth's byte
  mutable std::unordered_map<std::string, std::shared_ptr<const TokenMask>> cache_;
  mutable CacheStats stats_;
};

// Masks kept per constraint; past it the cache starts again.
inline constexpr size_t kMaxCachedMasks = 1024;

}  // namespace lazykv::grammar
