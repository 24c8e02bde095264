// `caote`: CAOTE (attention-output error). After every pass over budget, each
// KV head keeps its `recent` newest slots and, of the others, those whose
// eviction would move the current query's attention output the most: score
// p/(1-p) * |o - v| (see cpu::caote_scores), with p the current query's
// attention averaged over the GQA group (the last prompt token's at prefill)
// and o the output of that averaged attention. Unlike TOVA, which ranks by p
// alone, a slot whose value is close to the output it feeds costs little to
// drop. The score sees one query only, so without the recent window it drops
// tokens that the next queries need (docs/policies.md has the numbers).
#include <algorithm>

#include "kernels/cpu/eviction.h"
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class CaotePolicy final : public EvictionPolicy {
 public:
  CaotePolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{.attn_sum = true, .attn_last_prompt = true}),
        budget_(config.get_int("budget")),
        recent_(config.get_int("recent")) {}

 protected:
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    if (step() > 0 || prompt_just_completed()) {
      Scratch& s = scratch(layer);
      const int D = shape().head_dim;
      const float per_query = 1.0f / float(queries_per_head());
      for (size_t h = 0; h < heads.size(); ++h) {
        const Head& hd = heads[h];
        if (hd.n <= budget_) continue;
        s.probs.resize(size_t(hd.n));
        for (int32_t i = 0; i < hd.n; ++i) s.probs[size_t(i)] = hd.attn[size_t(i)] * per_query;
        s.values.resize(size_t(hd.n) * size_t(D));
        cpu::gather_values(cache.view(seq, layer, int(h)), D, s.values.data());
        s.aux.resize(size_t(D));
        s.scores.resize(size_t(hd.n));
        cpu::caote_scores(s.probs.data(), s.values.data(), hd.n, D, s.aux.data(), s.scores.data());
        keep_top(s.scores.data(), hd.n - recent_, hd.n, budget_ - recent_, keep[h], s.index);
      }
    }
    for (Head& hd : heads) std::fill(hd.attn.begin(), hd.attn.end(), 0.0f);  // only the current query counts
  }

 private:
  int32_t budget_, recent_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_caote_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<CaotePolicy>(config, shape);
}

}  // namespace lazykv
