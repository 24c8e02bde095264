// `laq`: Lookahead Q-Cache (arXiv 2505.20334). SnapKV scores the cache with
// queries it has seen; LAQ scores it with queries of tokens not yet written.
// When a compression is due (the prompt completes, then every `period`
// decode steps, whenever over budget) the policy waits: the engine copies
// the SnapKV selection of the cache (the last `window` queries vote) into a
// scratch sequence, decodes `lookahead` tokens greedily on it and hands back
// their queries (worker/draft.h). Those, with the last `recent` real queries
// (LAQ++), score every slot of the whole cache; their attention, averaged over
// the queries and the GQA group and max-pooled with `kernel`, keeps the top
// budget - recent slots beside the `recent` newest. The draft is discarded;
// decoding goes on from the token sampled before it.
//
// An engine loop that runs no draft still bounds the cache: a compression
// whose draft never came is done at the next pass with the window's queries
// (SnapKV's selection), as is one whose draft got no token (no room).
//
// Each query keeps its own causal mask; the authors' code masks the draft
// queries as if they were the last prompt positions, which hides the newest
// keys from them. Here a draft query sees every cached slot.
#include <algorithm>
#include <numeric>

#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class LaqPolicy final : public EvictionPolicy {
 public:
  LaqPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv,
                       Needs{.keep_queries = std::max(config.get_int("window"), config.get_int("recent"))}),
        budget_(config.get_int("budget")),
        lookahead_(config.get_int("lookahead")),
        recent_(config.get_int("recent")),
        window_(config.get_int("window")),
        kernel_(config.get_int("kernel")),
        period_(config.get_int("period")),
        due_step_(size_t(shape.n_layer), -1) {}

  int32_t draft_wanted() const override {
    const bool due = std::any_of(due_step_.begin(), due_step_.end(), [&](int32_t t) { return t == step(); });
    return due ? lookahead_ : 0;
  }

  void draft_slots(int layer, int head, const KvCache& cache, SeqId seq, std::vector<int32_t>& keep) override {
    window_keep(layer, head_state(layer, head), cache.view(seq, layer, head), keep);
  }

 protected:
  void draft_done() noexcept override { std::fill(due_step_.begin(), due_step_.end(), -1); }

  // Layers run concurrently: each touches only its own due_step_ entry.
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    int32_t& due = due_step_[size_t(layer)];
    if (draft() == nullptr) {
      const int32_t t = step();
      const bool stale = due >= 0 && due < t;  // no draft came: compact as SnapKV
      due = -1;
      for (size_t h = 0; h < heads.size() && stale; ++h) {
        window_keep(layer, heads[h], cache.view(seq, layer, int(h)), keep[h]);
      }
      const bool now = prompt_just_completed() || (t >= 1 && period_ > 0 && t % period_ == 0);
      for (const Head& hd : heads) {
        if (now && hd.n > budget_) due = t;
      }
      return;
    }
    const int qph = queries_per_head();
    const size_t stride = size_t(qph) * size_t(shape().head_dim);
    for (size_t h = 0; h < heads.size(); ++h) {
      const Head& hd = heads[h];
      if (hd.n <= budget_) continue;
      if (draft()->tokens == 0) {
        window_keep(layer, hd, cache.view(seq, layer, int(h)), keep[h]);
        continue;
      }
      const std::vector<float>& rows = draft()->heads[size_t(layer) * heads.size() + h];
      std::vector<std::pair<int32_t, const float*>> queries;
      for (int32_t i = 0; i < draft()->tokens; ++i) {
        queries.emplace_back(draft()->first_pos + i, rows.data() + size_t(i) * stride);
      }
      const auto seen = recent_queries(hd);
      const size_t from = seen.size() - std::min(seen.size(), size_t(recent_));
      queries.insert(queries.end(), seen.begin() + std::ptrdiff_t(from), seen.end());
      score_and_keep(queries, recent_, hd, cache.view(seq, layer, int(h)), scratch(layer), keep[h]);
    }
  }

 private:
  // SnapKV's selection: the last `window` real queries vote, their slots stay.
  void window_keep(int layer, const Head& hd, const cpu::KvPages& kv, std::vector<int32_t>& keep) {
    const auto queries = recent_queries(hd);
    const size_t from = queries.size() - std::min(queries.size(), size_t(window_));
    score_and_keep(std::span(queries).subspan(from), window_, hd, kv, scratch(layer), keep);
  }

  // SnapKV's rule; every slot when the head is within budget.
  void score_and_keep(std::span<const std::pair<int32_t, const float*>> queries, int32_t newest, const Head& hd,
                      const cpu::KvPages& kv, Scratch& s, std::vector<int32_t>& keep) {
    if (hd.n <= budget_) {
      keep.resize(size_t(hd.n));
      std::iota(keep.begin(), keep.end(), 0);
      return;
    }
    keep_by_pooled_attention(queries, newest, budget_ - newest, kernel_, hd, kv, s, keep);
  }

  int32_t budget_, lookahead_, recent_, window_, kernel_, period_;
  std::vector<int32_t> due_step_;        // [layer]: the step whose compression awaits a draft, -1: none
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_laq_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<LaqPolicy>(config, shape);
}

}  // namespace lazykv
