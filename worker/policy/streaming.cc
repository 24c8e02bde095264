// `streaming`: StreamingLLM. The first `sinks` tokens (attention sinks) and
// the most recent budget - sinks tokens stay; after every pass. With
// keep_prompt the whole prompt is the sinks.
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class StreamingPolicy final : public EvictionPolicy {
 public:
  StreamingPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{}),
        budget_(config.get_int("budget")),
        sinks_(config.get_int("sinks")) {}

 protected:
  void select(int, std::span<Head> heads, const KvCache&, SeqId, std::vector<std::vector<int32_t>>& keep) override {
    for (size_t h = 0; h < heads.size(); ++h) {
      const int32_t n = heads[h].n;
      if (n <= budget_) continue;
      const int32_t sinks = std::max(sinks_, kept_prompt_len());
      std::vector<int32_t>& k = keep[h];
      for (int32_t s = 0; s < sinks; ++s) k.push_back(s);
      for (int32_t s = n - (budget_ - sinks); s < n; ++s) k.push_back(s);
    }
  }

 private:
  int32_t budget_, sinks_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_streaming_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<StreamingPolicy>(config, shape);
}

}  // namespace lazykv
