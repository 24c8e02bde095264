// --kv-* flags: the eviction policy and its parameters, shared by every
// command that runs a model. Each policy parameter <p> is the flag --kv-<p>
// ('_' written '-'); a flag the chosen policy does not take is an error.
#include <set>

#include "cli/commands.h"
#include "common/error.h"

namespace lazykv {
namespace {

std::string flag_name(const std::string& param) {
  std::string flag = "kv-" + param;
  for (char& c : flag) c = c == '_' ? '-' : c;
  return flag;
}

}  // namespace

void add_policy_flags(Flags& flags) {
  flags.add("kv-policy", "full", "KV eviction policy: full, lazy, lazy+tiers, streaming, h2o, tova, snapkv, rkv, raas");
  std::set<std::string> seen;
  for (const PolicyInfo& info : policy_catalog()) {
    for (const PolicyParam& p : info.params) {
      if (!seen.insert(p.name).second) continue;
      flags.add(flag_name(p.name), "", "policy parameter: " + p.help + " (policies that take it; see docs/policies.md)");
    }
  }
}

PolicyConfig policy_from_flags(const Flags& flags) {
  std::map<std::string, std::string> params;
  std::set<std::string> seen;
  for (const PolicyInfo& info : policy_catalog()) {
    for (const PolicyParam& p : info.params) {
      if (!seen.insert(p.name).second) continue;
      if (flags.is_set(flag_name(p.name))) params[p.name] = flags.get(flag_name(p.name));
    }
  }
  return make_policy_config(flags.get("kv-policy"), params);
}

}  // namespace lazykv
