// `snapkv`: SnapKV. The last `window` queries (the observation window) vote:
// their attention over the older slots, averaged over the window and the GQA
// group and max-pooled with `kernel`, keeps the top budget - window of them;
// the window's own slots stay. Runs when the prompt completes and, as R-KV's
// comparisons do, every `period` decode steps, whenever over budget. The
// window's queries are remembered and rescored at compression time, so
// ordinary steps cost nothing.
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class SnapKvPolicy final : public EvictionPolicy {
 public:
  SnapKvPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{.keep_queries = config.get_int("window")}),
        budget_(config.get_int("budget")),
        window_(config.get_int("window")),
        kernel_(config.get_int("kernel")),
        period_(config.get_int("period")) {}

 protected:
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    const int32_t t = step();
    const bool due = prompt_just_completed() || (t >= 1 && period_ > 0 && t % period_ == 0);
    if (!due) return;
    for (size_t h = 0; h < heads.size(); ++h) {
      const Head& hd = heads[h];
      if (hd.n <= budget_) continue;
      keep_by_pooled_attention(recent_queries(hd), window_, budget_ - window_, kernel_, hd,
                               cache.view(seq, layer, int(h)), scratch(layer), keep[h]);
    }
  }

 private:
  int32_t budget_, window_, kernel_, period_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_snapkv_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<SnapKvPolicy>(config, shape);
}

}  // namespace lazykv
