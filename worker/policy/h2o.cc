// `h2o`: Heavy-Hitter Oracle. Each slot accumulates the attention it receives
// from every query (prompt queries included), summed over the GQA group; after
// every pass over budget, the `recent` newest slots stay and the heaviest
// budget - recent others are kept.
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class H2oPolicy final : public EvictionPolicy {
 public:
  H2oPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{.attn_sum = true, .attn_prefill = true}),
        budget_(config.get_int("budget")),
        recent_(config.get_int("recent") > 0 ? config.get_int("recent") : config.get_int("budget") / 2) {}

 protected:
  void select(int layer, std::span<Head> heads, const KvCache&, SeqId, std::vector<std::vector<int32_t>>& keep) override {
    Scratch& s = scratch(layer);
    for (size_t h = 0; h < heads.size(); ++h) {
      const Head& hd = heads[h];
      if (hd.n <= budget_) continue;
      keep_top(hd.attn.data(), hd.n - recent_, hd.n, budget_ - recent_, keep[h], s.index);
    }
  }

 private:
  int32_t budget_, recent_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_h2o_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<H2oPolicy>(config, shape);
}

}  // namespace lazykv
