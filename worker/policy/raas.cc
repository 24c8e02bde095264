// `raas`: RaaS. Each decode slot carries a timestamp, set to the step it
// arrives and refreshed to the current step whenever any query of its group
// gives it probability >= alpha. Prompt slots are never evicted; after every
// decode step over budget, the newest-timestamped decode slots fill what the
// prompt leaves of the budget (at least one: the newest token always stays).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class RaasPolicy final : public EvictionPolicy {
 public:
  RaasPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv,
                       Needs{.hits = true, .alpha = float(config.get("alpha")), .last_mri = true}),
        budget_(config.get_int("budget")) {}

 protected:
  void init_slots(Head& h, int32_t first, int32_t count, int32_t first_pos) override {
    for (int32_t i = 0; i < count; ++i) {
      h.last[size_t(first + i)] = step_of(first_pos + i);
      h.mri[size_t(first + i)] = 0;
    }
  }

  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    const int32_t t = step();
    if (t < 1) return;
    Scratch& s = scratch(layer);
    for (size_t h = 0; h < heads.size(); ++h) {
      Head& hd = heads[h];
      for (int32_t i = 0; i < hd.n; ++i) {
        if (hd.hits[size_t(i)] != 0) hd.last[size_t(i)] = t;
      }
      if (hd.n <= budget_) continue;
      // The request's prompt slots form a prefix (slot order is position order).
      const std::span<const int32_t> pos = cache.positions(seq, layer, int(h));
      const int32_t n_prompt = int32_t(std::lower_bound(pos.begin(), pos.end(), own_prompt_len()) - pos.begin());
      const int32_t n_decode = hd.n - n_prompt;
      const int32_t k = std::max(budget_ - n_prompt, 1);
      if (n_decode <= k) continue;
      // The newest slot always stays (a decode slot hit this step ties with
      // it on the timestamp, and ties go to the older position); the other
      // k - 1 are the newest-stamped of the rest.
      s.scores.resize(size_t(n_decode));
      for (int32_t i = 0; i < n_decode; ++i) s.scores[size_t(i)] = float(hd.last[size_t(n_prompt + i)]);
      std::vector<int32_t>& kp = keep[h];
      keep_top(s.scores.data(), n_decode - 1, n_decode, k - 1, kp, s.index);
      for (int32_t& v : kp) v += n_prompt;
      kp.insert(kp.begin(), size_t(n_prompt), 0);
      for (int32_t i = 0; i < n_prompt; ++i) kp[size_t(i)] = i;
    }
  }

  nlohmann::json slot_state(int layer, int head) const override {
    nlohmann::json j = EvictionPolicy::slot_state(layer, head);
    j.erase("mri");
    j["timestamp"] = j["last"];
    j.erase("last");
    return j;
  }

 private:
  int32_t budget_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_raas_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<RaasPolicy>(config, shape);
}

}  // namespace lazykv
