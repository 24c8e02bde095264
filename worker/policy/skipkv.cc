// `skipkv`: SkipKV's sentence-level eviction (arXiv 2512.07993). The
// generated text is cut into sentences: one ends at a token whose text holds
// a newline once it has min_sentence tokens, or at max_sentence tokens. A
// sentence's embedding is the mean of its tokens' final hidden states (after
// the output norm), L2-normalized. When a sentence closes, every earlier
// tracked sentence whose embedding has cosine >= tau with it is redundant:
// its penalty is the largest such cosine.
//
// With steer > 0, activation steering (SkipKV's, after SEAL): at each decode
// token that ends a thought (a blank line), the model's steering vector times
// min(steer_max, steer + steer_step x the thoughts so far that held a
// reflection word) is added to the residual after the vector's layer.
//
// Compression runs when R-KV's does (rkv.h), per KV head: the older slots'
// R-KV scores, less penalty x the slot's sentence penalty, are averaged over
// each closed sentence's slots; the lowest sentences leave whole (ties: the
// newer first) until the older slots fit budget - window. The sentence that
// crosses the line loses only its lowest slots. Prompt slots and those of
// the open sentence are units of one slot.
#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>

#include "common/error.h"
#include "worker/policy/policies.h"
#include "worker/policy/rkv.h"

namespace lazykv {
namespace {

// Sentences whose embeddings later sentences are compared with: the newest
// ones (an older one keeps its penalty, and is no longer compared).
constexpr size_t kTrackedSentences = 256;

class SkipKvPolicy final : public RkvPolicy {
 public:
  SkipKvPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : RkvPolicy(config, shape),
        tau_(config.get("tau")),
        penalty_weight_(float(config.get("penalty"))),
        min_sentence_(config.get_int("min_sentence")),
        max_sentence_(config.get_int("max_sentence")),
        token_classes_(shape.token_classes),
        steer_(float(config.get("steer"))),
        steer_step_(float(config.get("steer_step"))),
        steer_max_(float(config.get("steer_max"))),
        open_first_(shape.prompt_len) {}

  float steering_scale(int32_t pos, int32_t token) override {
    if (steer_ == 0.0f || pos < prompt_len() || !thought_has_text_ ||
        !ends_thought(last_bits_, token_class(*token_classes_, token))) {
      return 0.0f;
    }
    return std::min(steer_max_, steer_ + steer_step_ * float(reflection_thoughts_));
  }

  bool wants_hidden() const override { return true; }

  void observe_token(int32_t pos, int32_t token, std::span<const float> hidden) override {
    if (pos < open_first_) return;  // already in a closed sentence
    if (open_sum_.empty()) open_sum_.assign(hidden.size(), 0.0);
    if (hidden.size() != open_sum_.size()) {
      throw Error(ErrorCode::kInternal, "policy skipkv: hidden states of " + std::to_string(hidden.size()) +
                                            " values after " + std::to_string(open_sum_.size()));
    }
    for (size_t d = 0; d < hidden.size(); ++d) open_sum_[d] += double(hidden[d]);
    const uint8_t bits = token_class(*token_classes_, token);
    thought_reflects_ = thought_reflects_ || (bits & kReflection);
    if (thought_has_text_ && ends_thought(last_bits_, bits)) {
      reflection_thoughts_ += thought_reflects_;
      thought_reflects_ = thought_has_text_ = false;
    }
    thought_has_text_ = thought_has_text_ || !(bits & kSentenceEnd);
    last_bits_ = bits;
    const int32_t length = pos + 1 - open_first_;
    const bool at_end = (bits & kSentenceEnd) != 0;
    if ((at_end && length >= min_sentence_) || length >= max_sentence_) close_sentence(pos + 1);
  }

 protected:
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    if (!compression_due()) return;
    Scratch& s = scratch(layer);
    for (size_t h = 0; h < heads.size(); ++h) {
      const Head& hd = heads[h];
      if (hd.n <= budget_) continue;
      const cpu::KvPages kv = cache.view(seq, layer, int(h));
      score_older(hd, kv, s);
      const int32_t nc = hd.n - window_;
      s.index.resize(size_t(nc));  // each older slot's sentence (-1: none)
      for (int32_t i = 0; i < nc; ++i) {
        const int32_t sentence = sentence_of(kv.positions[i]);
        s.index[size_t(i)] = sentence;
        if (sentence >= 0) s.pooled[size_t(i)] -= penalty_weight_ * penalties_[size_t(sentence)];
      }
      keep_sentences(s.pooled, s.index, nc, hd.n, keep[h]);
    }
  }

 private:
  struct Unit {
    int32_t first, count;
    double score;  // mean over the unit's slots
  };

  // The closed sentence holding position pos, or -1.
  int32_t sentence_of(int32_t pos) const {
    if (pos < prompt_len() || pos >= open_first_) return -1;
    return int32_t(std::upper_bound(sentence_ends_at_.begin(), sentence_ends_at_.end(), pos) -
                   sentence_ends_at_.begin());
  }

  void close_sentence(int32_t end) {
    double norm = 0.0;
    for (double v : open_sum_) norm += v * v;
    norm = std::sqrt(norm);
    std::vector<float> embedding(open_sum_.size(), 0.0f);
    if (norm > 0.0) {
      for (size_t d = 0; d < open_sum_.size(); ++d) embedding[d] = float(open_sum_[d] / norm);
    }
    for (const auto& [index, earlier] : tracked_) {
      double cosine = 0.0;
      for (size_t d = 0; d < embedding.size(); ++d) cosine += double(earlier[d]) * double(embedding[d]);
      if (cosine >= tau_) penalties_[size_t(index)] = std::max(penalties_[size_t(index)], float(cosine));
    }
    tracked_.emplace_back(int32_t(penalties_.size()), std::move(embedding));
    if (tracked_.size() > kTrackedSentences) tracked_.pop_front();
    penalties_.push_back(0.0f);
    sentence_ends_at_.push_back(end);
    open_first_ = end;
    std::fill(open_sum_.begin(), open_sum_.end(), 0.0);
  }

  // Drops the lowest units of [lead, nc) until nc - (budget - window) slots
  // are gone; the newest `window` slots stay. (Layers select concurrently:
  // local scratch, once per `period` steps.)
  void keep_sentences(const std::vector<float>& scores, const std::vector<int32_t>& sentence, int32_t nc, int32_t n,
                      std::vector<int32_t>& keep) {
    const int32_t lead = std::min(kept_prompt_len(), nc);
    int32_t to_drop = nc - std::clamp(budget_ - window_, lead, nc);
    std::vector<Unit> units;
    for (int32_t i = lead; i < nc;) {
      int32_t j = i + 1;
      if (sentence[size_t(i)] >= 0) {
        while (j < nc && sentence[size_t(j)] == sentence[size_t(i)]) ++j;
      }
      double sum = 0.0;
      for (int32_t a = i; a < j; ++a) sum += double(scores[size_t(a)]);
      units.push_back({i, j - i, sum / double(j - i)});
      i = j;
    }
    std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
      return a.score != b.score ? a.score < b.score : a.first > b.first;
    });
    std::vector<uint8_t> dropped(size_t(nc), 0);
    std::vector<int32_t> slots;
    for (const Unit& u : units) {
      if (to_drop == 0) break;
      slots.resize(size_t(u.count));
      std::iota(slots.begin(), slots.end(), u.first);
      if (u.count > to_drop) {  // the unit that crosses the line: its lowest slots
        std::sort(slots.begin(), slots.end(), [&](int32_t a, int32_t b) {
          return scores[size_t(a)] != scores[size_t(b)] ? scores[size_t(a)] < scores[size_t(b)] : a > b;
        });
        slots.resize(size_t(to_drop));
      }
      for (int32_t slot : slots) dropped[size_t(slot)] = 1;
      to_drop -= int32_t(slots.size());
    }
    keep.clear();
    for (int32_t i = 0; i < n; ++i) {
      if (i >= nc || !dropped[size_t(i)]) keep.push_back(i);
    }
  }

  double tau_;
  float penalty_weight_;
  int32_t min_sentence_, max_sentence_;
  std::shared_ptr<const TokenClasses> token_classes_;
  // Closed sentences cover [prompt_len, open_first_): sentence i ends before
  // sentence_ends_at_[i]; the open one starts at open_first_.
  std::vector<int32_t> sentence_ends_at_;
  std::vector<float> penalties_;
  std::deque<std::pair<int32_t, std::vector<float>>> tracked_;  // (sentence, unit embedding)
  float steer_, steer_step_, steer_max_;
  int32_t open_first_;
  std::vector<double> open_sum_;
  // Thoughts (text between blank lines) so far that held a reflection word,
  // and whether the current one does.
  int32_t reflection_thoughts_ = 0;
  bool thought_reflects_ = false;
  bool thought_has_text_ = false;  // a token without a newline since the last thought ended
  uint8_t last_bits_ = 0;          // the class of the last token observed
};

}  // namespace

std::string skipkv_unavailable(const PolicyShape& shape) {
  return shape.token_classes ? std::string()
                             : "the model carries no token texts to find sentence ends in (a Hugging Face "
                               "directory; use its GGUF file)";
}

std::unique_ptr<EvictionPolicy> make_skipkv_policy(const PolicyConfig& config, const PolicyShape& shape) {
  if (std::string why = skipkv_unavailable(shape); !why.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "policy skipkv: " + why);
  }
  if (config.get("steer") > 0 && shape.steering == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "policy skipkv: steer > 0 needs the model's steering vector: " +
                                                 (shape.steering_missing.empty() ? std::string("none given")
                                                                                 : shape.steering_missing));
  }
  return std::make_unique<SkipKvPolicy>(config, shape);
}

}  // namespace lazykv
