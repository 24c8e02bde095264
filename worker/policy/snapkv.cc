// `snapkv`: SnapKV. The last `window` queries (the observation window) vote:
// their attention over the older slots, averaged over the window and the GQA
// group and max-pooled with `kernel`, keeps the top budget - window of them;
// the window's own slots stay. Runs when the prompt completes and, as R-KV's
// comparisons do, every `period` decode steps, whenever over budget. The
// window's queries are remembered and rescored at compression time, so
// ordinary steps cost nothing.
#include "kernels/cpu/eviction.h"
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
    Scratch& s = scratch(layer);
    for (size_t h = 0; h < heads.size(); ++h) {
      const Head& hd = heads[h];
      if (hd.n <= budget_) continue;
      const int32_t n_candidates = hd.n - window_;
      const int32_t rows = recent_query_probs(hd, cache.view(seq, layer, int(h)), s.probs);
      s.scores.assign(size_t(n_candidates), 0.0f);
      for (int32_t r = 0; r < rows; ++r) {
        const float* p = s.probs.data() + size_t(r) * size_t(hd.n);
        for (int32_t i = 0; i < n_candidates; ++i) s.scores[size_t(i)] += p[i];
      }
      if (rows > 0) {
        for (float& v : s.scores) v /= float(rows);
      }
      s.pooled.resize(size_t(n_candidates));
      cpu::max_pool1d(s.scores.data(), n_candidates, kernel_, s.pooled.data());
      keep_top(s.pooled.data(), n_candidates, hd.n, budget_ - window_, keep[h], s.index);
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
