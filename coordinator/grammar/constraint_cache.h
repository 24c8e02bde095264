// Compiled token constraints by response format, for one tokenizer: the
// vocabulary's trie is built once (on the first structured request), and a
// schema asked for again reuses its constraint, masks cached by state
// included. Shared by the HTTP and gRPC services.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "coordinator/grammar/token_constraint.h"

namespace lazykv::grammar {

class ConstraintCache {
 public:
  static constexpr size_t kMaxConstraints = 64;  // the least recently used goes first

  explicit ConstraintCache(const Tokenizer& tokenizer);
  std::shared_ptr<const TokenConstraint> get(const ResponseGrammar& grammar);

 private:
  const Tokenizer& tokenizer_;
  std::mutex mutex_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::list<std::pair<std::string, std::shared_ptr<const TokenConstraint>>> recent_;  // most recent first
  std::unordered_map<std::string, decltype(recent_)::iterator> by_key_;
};

}  // namespace lazykv::grammar
