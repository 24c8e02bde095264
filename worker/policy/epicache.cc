// `epicache`: EpiCache (arXiv 2509.17396), episodic compression of a long
// conversation. The harness (eval/conversation.h) clusters the history into
// episodes and routes the question to one; this policy builds that
// episode's cache. The history is prefilled in blocks of `block` tokens;
// after each block the engine runs the episode's patched prompt on a copy
// of the cache (a draft of the policy's own tokens, worker/draft.h) and
// discards it. Each slot scores the most attention any patched-prompt query
// of its GQA group gives it; a layer keeps its budget x heads best slots
// over all its heads (uniform=1: budget per head), the first `sinks` always
// (a head that wins none keeps its newest).
// The question and the answer then go on the compressed history unevicted:
// peak is about budget + block per head while the history streams in.
#include <algorithm>
#include <atomic>
#include <limits>
#include <numeric>
#include <span>

#include "common/error.h"
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class EpiCachePolicy final : public EvictionPolicy {
 public:
  EpiCachePolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{}),
        episode_(shape.episode),
        budget_(config.get_int("budget")),
        block_(config.get_int("block")),
        sinks_(config.get_int("sinks")),
        uniform_(config.get_int("uniform") != 0) {}

  // Every history token's query goes through the pass (no prefix-cache reuse):
  // a block's compression must see the whole block.
  int32_t reusable_prompt() const override { return 0; }
  int32_t prefill_block(int32_t pos) const override {
    return pos < episode_->history_len ? std::min(block_, episode_->history_len - pos) : 0;
  }
  int32_t draft_wanted() const override { return due_ ? int32_t(episode_->tokens.size()) : 0; }
  std::span<const int32_t> draft_tokens() const override {
    return due_ ? std::span<const int32_t>(episode_->tokens) : std::span<const int32_t>();
  }

 protected:
  void draft_done() noexcept override { due_ = false; }

  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    if (draft() == nullptr) {  // a block of history is in: compress once the draft comes
      if (pass_end() <= episode_->history_len && over_budget(heads)) due_ = true;
      return;
    }
    Scratch& s = scratch(layer);
    s.aux.clear();  // the layer's scores, head after head
    for (size_t h = 0; h < heads.size(); ++h) {
      score_head(layer, int(h), heads[h], cache.view(seq, layer, int(h)), cache.positions(seq, layer, int(h)), s);
      s.aux.insert(s.aux.end(), s.scores.begin(), s.scores.end());
    }
    if (uniform_) {
      const float* scores = s.aux.data();
      for (size_t h = 0; h < heads.size(); scores += heads[h].n, ++h) {
        if (heads[h].n > budget_) keep_top(scores, heads[h].n, heads[h].n, budget_, keep[h], s.index);
      }
    } else if (over_budget(heads)) {
      keep_layer_top(heads, s, keep);
    }
  }

 private:
  bool over_budget(std::span<const Head> heads) const {
    int64_t slots = 0;
    bool head_over = false;
    for (const Head& h : heads) {
      slots += h.n;
      head_over = head_over || h.n > budget_;
    }
    return uniform_ ? head_over : slots > int64_t(budget_) * int64_t(heads.size());
  }

  // s.scores[slot]: the most any draft query of the head's group attends to
  // it (+inf for the sinks); without draft queries (no room for the copy)
  // the newest positions score highest, in every head alike. The first
  // `sinks` slots are the first positions: sinks < budget, so none has left.
  void score_head(int layer, int h, const Head& hd, const cpu::KvPages& kv, std::span<const int32_t> positions,
                  Scratch& s) const {
    const int qph = queries_per_head();
    const size_t n = size_t(hd.n), stride = size_t(qph) * size_t(shape().head_dim);
    s.scores.assign(n, 0.0f);
    if (draft()->tokens == 0) {
      std::transform(positions.begin(), positions.end(), s.scores.begin(), [](int32_t p) { return float(p); });
    } else {
      const std::vector<float>& rows = draft()->heads[size_t(layer) * size_t(heads_per_layer()) + size_t(h)];
      s.probs.resize(size_t(qph) * n);
      for (int32_t i = 0; i < draft()->tokens; ++i) {
        cpu::attention_probs(rows.data() + size_t(i) * stride, qph, shape().head_dim, kv, draft()->first_pos + i,
                             shape().attn_scale, s.probs.data());
        for (size_t r = 0; r < size_t(qph); ++r) {
          const float* p = s.probs.data() + r * n;
          for (size_t j = 0; j < n; ++j) s.scores[j] = std::max(s.scores[j], p[j]);
        }
      }
    }
    const size_t sinks = std::min(n, size_t(sinks_));
    std::fill_n(s.scores.begin(), sinks, std::numeric_limits<float>::infinity());
  }

  // The layer's budget x heads best slots over all heads (ties: older slot,
  // then lower head); each head's kept indices in increasing order. A head
  // left with none keeps its newest (one over the layer's share).
  void keep_layer_top(std::span<const Head> heads, Scratch& s, std::vector<std::vector<int32_t>>& keep) const {
    std::vector<int32_t> head_of, slot_of;
    for (size_t h = 0; h < heads.size(); ++h) {
      for (int32_t j = 0; j < heads[h].n; ++j) {
        head_of.push_back(int32_t(h));
        slot_of.push_back(j);
      }
    }
    s.index.resize(head_of.size());
    std::iota(s.index.begin(), s.index.end(), 0);
    const size_t k = std::min(s.index.size(), size_t(budget_) * heads.size());
    std::partial_sort(s.index.begin(), s.index.begin() + std::ptrdiff_t(k), s.index.end(), [&](int32_t a, int32_t b) {
      if (s.aux[size_t(a)] != s.aux[size_t(b)]) return s.aux[size_t(a)] > s.aux[size_t(b)];
      if (slot_of[size_t(a)] != slot_of[size_t(b)]) return slot_of[size_t(a)] < slot_of[size_t(b)];
      return head_of[size_t(a)] < head_of[size_t(b)];
    });
    for (size_t h = 0; h < heads.size(); ++h) keep[h].clear();
    for (size_t i = 0; i < k; ++i) {
      const int32_t e = s.index[i];
      keep[size_t(head_of[size_t(e)])].push_back(slot_of[size_t(e)]);
    }
    for (size_t h = 0; h < heads.size(); ++h) {
      std::sort(keep[h].begin(), keep[h].end());
      if (keep[h].empty()) keep[h].push_back(heads[h].n - 1);  // an empty keep would keep all: the newest stays
    }
  }

  std::shared_ptr<const EpisodePrompt> episode_;
  int32_t budget_, block_, sinks_;
  bool uniform_;
  std::atomic<bool> due_{false};         // a block awaits its draft (layers set it concurrently)
};

}  // namespace

std::string epicache_unavailable(const PolicyShape& shape) {
  if (!shape.episode) {
    return "no episode: epicache compresses a conversation's history for the episode its question is routed to, "
           "which `lazykv eval conversation` chooses";
  }
  if (shape.episode->tokens.empty()) return "the episode's patched prompt is empty";
  if (shape.episode->history_len < 1 || shape.episode->history_len > shape.prompt_len) {
    return "the history (" + std::to_string(shape.episode->history_len) + " tokens) must lie within the prompt (" +
           std::to_string(shape.prompt_len) + ")";
  }
  return "";
}

std::unique_ptr<EvictionPolicy> make_epicache_policy(const PolicyConfig& config, const PolicyShape& shape) {
  if (std::string why = epicache_unavailable(shape); !why.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "policy epicache: " + why);
  }
  return std::make_unique<EpiCachePolicy>(config, shape);
}

}  // namespace lazykv
