// `tova`: Token Omission Via Attention. After every pass over budget, the
// current query's attention (the last prompt token's at prefill), summed over
// all query heads of the layer, picks one shared top-`budget` for every head
// of the layer. Every head of a layer therefore holds the same positions.
#include <algorithm>

#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class TovaPolicy final : public EvictionPolicy {
 public:
  TovaPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{.attn_sum = true, .attn_last_prompt = true}),
        budget_(config.get_int("budget")) {}

 protected:
  void select(int layer, std::span<Head> heads, const KvCache&, SeqId, std::vector<std::vector<int32_t>>& keep) override {
    const int32_t n = heads[0].n;
    if (n > budget_ && (step() > 0 || prompt_just_completed())) {
      Scratch& s = scratch(layer);
      s.scores.assign(size_t(n), 0.0f);
      for (const Head& hd : heads) {
        for (int32_t i = 0; i < n; ++i) s.scores[size_t(i)] += hd.attn[size_t(i)];
      }
      keep_top(s.scores.data(), n, n, budget_, keep[0], s.index);
      for (size_t h = 1; h < heads.size(); ++h) keep[h] = keep[0];
    }
    for (Head& hd : heads) std::fill(hd.attn.begin(), hd.attn.end(), 0.0f);  // only the current query counts
  }

 private:
  int32_t budget_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_tova_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<TovaPolicy>(config, shape);
}

}  // namespace lazykv
