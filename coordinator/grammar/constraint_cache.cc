#include "coordinator/grammar/constraint_cache.h"

#include "coordinator/tokenizer/tokenizer.h"

namespace lazykv::grammar {

ConstraintCache::ConstraintCache(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

std::shared_ptr<const TokenConstraint> ConstraintCache::get(const ResponseGrammar& grammar) {
  std::lock_guard lock(mutex_);
  if (const auto it = by_key_.find(grammar.key); it != by_key_.end()) {
    recent_.splice(recent_.begin(), recent_, it->second);
    return it->second->second;
  }
  if (!vocabulary_) vocabulary_ = std::make_shared<const TokenVocabulary>(tokenizer_);
  std::vector<int32_t> ends = tokenizer_.spec().eog_ids;
  if (ends.empty() && tokenizer_.spec().eos_id >= 0) ends.push_back(tokenizer_.spec().eos_id);
  auto constraint = std::make_shared<const TokenConstraint>(*grammar.schema, vocabulary_, std::move(ends));
  recent_.emplace_front(grammar.key, constraint);
  by_key_[grammar.key] = recent_.begin();
  if (recent_.size() > kMaxConstraints) {
    by_key_.erase(recent_.back().first);
    recent_.pop_back();
  }
  return constraint;
}

}  // namespace lazykv::grammar
