// Factories of the individual policies (one file each); policy_factories()
// names them.
#pragma once

#include <memory>

#include "worker/policy/policy.h"

namespace lazykv {

std::unique_ptr<EvictionPolicy> make_full_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_lazy_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_lazy_tiers_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_streaming_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_h2o_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_tova_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_snapkv_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_rkv_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_raas_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_caote_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_obcache_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_vase_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_triattention_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_laq_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_skipkv_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_trimkv_policy(const PolicyConfig& config, const PolicyShape& shape);
std::unique_ptr<EvictionPolicy> make_epicache_policy(const PolicyConfig& config, const PolicyShape& shape);

// What a policy needs of the model beyond its shape; policy_unavailable()
// names them, and the policy's factory refuses a shape that lacks it. Each
// returns why the model lacks it, or "".
std::string triattention_unavailable(const PolicyShape& shape);
std::string skipkv_unavailable(const PolicyShape& shape);
std::string trimkv_unavailable(const PolicyShape& shape);
std::string epicache_unavailable(const PolicyShape& shape);

}  // namespace lazykv
