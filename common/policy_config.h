// Eviction policies by name, with typed, validated parameters. The catalog is
// the one list of policies, their parameters and the rules between them: the
// CLI, the API and trace replay all build a PolicyConfig through it, so an
// unknown name or a bad value gets the same clear error everywhere. It lives
// in common so that the coordinator validates requests without the engine;
// the engine's factories (worker/policy/policy.cc) are keyed by the same
// names, and a test holds the two lists equal. A new policy is its file, a
// row here and its factory's row there.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lazykv {

struct PolicyParam {
  std::string name;
  double default_value = 0;
  double min = 0;
  double max = 0;
  bool integer = true;
  std::string help;
};

struct PolicyInfo {
  std::string name;
  std::string summary;
  std::vector<PolicyParam> params;
  // Rules between values, beyond each parameter's range:
  std::vector<std::string> below_budget;  // parameters that must be smaller than budget
  std::vector<std::string> odd;           // parameters that must be odd (pooling kernels)
  // The parameter counting the newest slots every compaction keeps (a
  // window or recent window), or empty: with keep_prompt=1 the prompt and
  // these must leave room in the budget for a scored slot.
  std::string recent;
  // True for a policy that needs a conversation routed to an episode
  // (epicache: lazykv eval conversation), which no single prompt gives; not
  // among an evaluation's "all".
  bool episodic = false;
};

// Every policy lazykv offers, in documentation order.
const std::vector<PolicyInfo>& policy_catalog();
// The catalog's names, comma-separated: "full, lazy, ...".
std::string policy_names();

struct PolicyConfig {
  std::string name = "full";
  std::map<std::string, double> params;  // every parameter of the policy, defaults filled in

  double get(const std::string& param) const;  // throws kInternal for a name the policy lacks
  int32_t get_int(const std::string& param) const { return int32_t(get(param)); }
  int32_t budget() const;  // slots per KV head after compaction; 0 for `full`
  // "lazy(alpha=0.0001,budget=512,per_query_head=0,window=128)"
  std::string to_string() const;
  nlohmann::json to_json() const;
};

// Validates the name and each parameter (range, integer-ness, cross-parameter
// rules such as window < budget). Throws Error(kInvalidArgument) naming the
// valid policies or the policy's valid parameters and ranges.
PolicyConfig make_policy_config(const std::string& name, const std::map<std::string, std::string>& params = {});
inline PolicyConfig make_policy_config(const char* name) { return make_policy_config(std::string(name)); }
// From {"name": ..., "<param>": value, ...}.
PolicyConfig make_policy_config(const nlohmann::json& spec);

// The newest slots a compaction of this policy always keeps (its row's
// `recent` parameter; h2o's recent 0 is half the budget).
int32_t recent_slots(const PolicyConfig& config);

// Why the policy cannot run a prompt of prompt_len tokens, or "" when it can.
// A policy whose keep_prompt parameter is 1 never evicts the prompt, so the
// prompt and the policy's recent slots must leave room in the budget for a
// slot chosen by its score. The coordinator
// asks before admitting a request (a 400, not a failed step); the engine asks
// again when it builds the policy.
std::string prompt_refusal(const PolicyConfig& config, int64_t prompt_len);

}  // namespace lazykv
