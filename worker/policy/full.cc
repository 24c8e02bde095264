// `full`: no eviction. Still an EvictionPolicy so that reports (slots, peak
// bytes) are measured the same way for every policy.
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

class FullPolicy final : public EvictionPolicy {
 public:
  FullPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{}) {}

 protected:
  void select(int, std::span<Head>, const KvCache&, SeqId, std::vector<std::vector<int32_t>>&) override {}
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_full_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<FullPolicy>(config, shape);
}

}  // namespace lazykv
