// `obcache`: OBCache (Optimal Brain Cache, arXiv:2510.07651), its joint
// key-value score on an H2O base. Each slot accumulates, over the queries that
// see it, how far pruning its key and value would move their attention
// outputs (squared, to first order; see cpu::obcache_accumulate), summed over
// the query heads of its GQA group. Scored queries: at prefill the last
// max(recent, 1) prompt queries, as the paper scores the prompt's last
// `recent`; then every decode query. After every pass over budget, each KV
// head keeps its `recent` newest slots and the highest-scoring others.
// accumulate = 0 scores with the current query alone (the paper's TOVA base).
//
// The kernel's attention probabilities are summed over the group, but the
// score needs each query head's own logits and output, so the policy keeps the
// current query and recomputes them from the cache: about two attention passes
// more per step.
#include <algorithm>

#include "kernels/cpu/eviction.h"
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class ObcachePolicy final : public EvictionPolicy {
 public:
  ObcachePolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv,
                       Needs{.slot_score = true,
                             // The prompt's last max(recent, 1) queries (no more than it has);
                             // decode needs only the current one.
                             .keep_queries = config.get_int("accumulate") != 0
                                                 ? std::clamp(config.get_int("recent"), 1, std::max(shape.prompt_len, 1))
                                                 : 1}),
        budget_(config.get_int("budget")),
        recent_(config.get_int("recent")),
        accumulate_(config.get_int("accumulate") != 0) {}

 protected:
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    const bool decoding = step() > 0;
    if (!decoding && !prompt_just_completed()) return;  // the prompt is scored once it is whole
    const int32_t current = decoding ? prompt_len() + step() - 1 : prompt_len() - 1;
    Scratch& s = scratch(layer);
    const int D = shape().head_dim;
    const int qph = queries_per_head();
    for (size_t h = 0; h < heads.size(); ++h) {
      Head& hd = heads[h];
      const int32_t n = hd.n;
      if (!accumulate_) std::fill(hd.score.begin(), hd.score.end(), 0.0f);
      const cpu::KvPages kv = cache.view(seq, layer, int(h));
      s.values.resize(size_t(n) * size_t(D));
      cpu::gather_values(kv, D, s.values.data());
      s.probs.resize(size_t(qph) * size_t(n));
      s.aux.resize(size_t(n) + size_t(D));
      for (const auto& [pos, q] : recent_queries(hd)) {
        // Decode scores the current query; the ring's older ones were scored at their own steps.
        if (pos > current || (pos < current && (decoding || !accumulate_))) continue;
        cpu::attention_logits(q, qph, D, kv, pos, shape().attn_scale, s.probs.data());
        cpu::obcache_accumulate(s.probs.data(), qph, s.values.data(), n, D, s.aux.data(), s.aux.data() + n,
                                hd.score.data());
      }
      if (n > budget_) keep_top(hd.score.data(), n - recent_, n, budget_ - recent_, keep[h], s.index);
    }
  }

 private:
  int32_t budget_, recent_;
  bool accumulate_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_obcache_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<ObcachePolicy>(config, shape);
}

}  // namespace lazykv
