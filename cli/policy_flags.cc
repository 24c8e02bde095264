// --kv-* flags: the eviction policy and its parameters, shared by every
// command that runs a model. Each policy parameter <p> is the flag --kv-<p>
// ('_' written '-'); a flag the chosen policy does not take is an error.
#include <algorithm>
#include <map>
#include <set>
#include <vector>

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
  flags.add("kv-policy", "full", "KV eviction policy: " + policy_names());
  // One flag per parameter name; where policies mean different things by it,
  // the help says which policies mean what.
  std::vector<std::string> order;
  // param -> its distinct helps, in catalog order, each with the policies that use it
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> meanings;
  for (const PolicyInfo& info : policy_catalog()) {
    for (const PolicyParam& p : info.params) {
      auto& m = meanings[p.name];
      if (m.empty()) order.push_back(p.name);
      auto it = std::find_if(m.begin(), m.end(), [&](const auto& e) { return e.second == p.help; });
      if (it == m.end()) {
        m.emplace_back(info.name, p.help);
      } else {
        it->first += ", " + info.name;
      }
    }
  }
  for (const std::string& name : order) {
    const auto& m = meanings[name];
    std::string help = "policy parameter: ";
    if (m.size() == 1) {
      help += m.front().second;
    } else {
      for (size_t i = 0; i < m.size(); ++i) help += (i == 0 ? "" : "; ") + m[i].first + ": " + m[i].second;
    }
    flags.add(flag_name(name), "", help + " (policies that take it; see docs/policies.md)");
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
