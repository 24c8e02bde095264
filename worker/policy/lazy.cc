// `lazy`: LazyEviction (docs/policies.md; semantics in docs/architecture.md).
// Every decode step, hits (p >= alpha, any query of the group) update each
// slot's last hit and maximum recurrence interval; every W steps, when the
// cache holds more than C slots, the W most recent slots stay and the top
// C - W others by importance are kept.
#include "kernels/cpu/eviction.h"
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class LazyPolicy final : public EvictionPolicy {
 public:
  LazyPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape,
                       config.get_int("per_query_head") != 0 ? shape.n_head_kv * shape.n_group : shape.n_head_kv,
                       Needs{.hits = true, .alpha = float(config.get("alpha")), .last_mri = true}),
        budget_(config.get_int("budget")),
        window_(config.get_int("window")) {}

 protected:
  void select(int layer, std::span<Head> heads, const KvCache&, SeqId, std::vector<std::vector<int32_t>>& keep) override {
    const int32_t t = step();
    if (t < 1) return;  // prompt slots start at last = 0, mri = 0; nothing observed yet
    Scratch& s = scratch(layer);
    for (size_t h = 0; h < heads.size(); ++h) {
      Head& hd = heads[h];
      cpu::lazy_update(hd.hits.data(), hd.last.data(), hd.mri.data(), hd.n, t);
      if (t % window_ != 0 || hd.n <= budget_) continue;
      const int32_t n_candidates = hd.n - window_;
      s.scores.resize(size_t(n_candidates));
      cpu::lazy_scores(hd.last.data(), hd.mri.data(), n_candidates, t, s.scores.data());
      keep_top(s.scores.data(), n_candidates, hd.n, budget_ - window_, keep[h], s.index);
    }
  }

 private:
  int32_t budget_, window_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_lazy_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<LazyPolicy>(config, shape);
}

}  // namespace lazykv
