#include "eval/policy_grid.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <utility>

#include "common/error.h"

namespace lazykv::eval {

const char* const kParamRule =
    "budget < 1 is a ratio r of the base length: max(8, round(r * base)) slots; >= 1 is absolute slots. "
    "The observation/recent window (lazy, lazy+tiers, snapkv, rkv, vase `window`; caote, obcache `recent`) is min(catalog default, "
    "max(1, budget / 4)), so "
    "that at least three quarters of the budget is chosen by the policy's score; streaming keeps its 4 sinks and "
    "h2o its half-budget recent window. A window-like value set in a --policies spec, name(param=value), is kept "
    "unless it is not below the budget; then it is max(1, budget / 4) too.";

int32_t budget_slots(double budget, int64_t base) {
  if (budget < 1) return std::max<int32_t>(8, int32_t(std::llround(budget * double(base))));
  return int32_t(budget);
}

namespace {

// "name(a=1,b=2)" -> name and {a: 1, b: 2}; a plain name has no parameters.
std::pair<std::string, std::map<std::string, std::string>> split_spec(const std::string& spec) {
  const size_t open = spec.find('(');
  if (open == std::string::npos) return {spec, {}};
  const auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument, "--policies: '" + spec + "': " + why);
  };
  if (spec.back() != ')') throw bad("expected name(param=value,...)");
  std::string name = spec.substr(0, open);
  name.erase(name.find_last_not_of(" \t") + 1);
  const std::vector<std::string> items = split_list(spec.substr(open + 1, spec.size() - open - 2));
  if (items.empty()) throw bad("no parameters between the parentheses (write '" + name + "')");
  std::map<std::string, std::string> params;
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw bad("'" + item + "' is not param=value");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    key.erase(key.find_last_not_of(" \t") + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    if (key == "budget") throw bad("the budget comes from --budgets");
    if (!params.emplace(key, value).second) throw bad("'" + key + "' given twice");
  }
  return {name, params};
}

// Parameters that must stay below the budget (policy_config.cc's cross rules).
bool window_like(const std::string& param) { return param == "window" || param == "sinks" || param == "recent"; }

}  // namespace

PolicyConfig grid_policy_config(const std::string& spec, int32_t budget) {
  const auto [name, given] = split_spec(spec);
  if (name == "full") return make_policy_config(std::string("full"), given);
  std::map<std::string, std::string> params = {{"budget", std::to_string(budget)}};
  for (const PolicyInfo& info : policy_catalog()) {
    if (info.name != name) continue;
    for (const PolicyParam& p : info.params) {
      if (p.name == "window" || ((name == "caote" || name == "obcache") && p.name == "recent")) {
        params[p.name] = std::to_string(std::min(int32_t(p.default_value), std::max(1, budget / 4)));
      } else if (p.name == "sinks" && p.default_value >= budget) {
        params[p.name] = std::to_string(std::max(1, budget / 4));
      }
    }
  }
  for (const auto& [key, value] : given) {
    // A given window that does not fit this budget (budgets follow each
    // problem's length) is cut as the defaults are, not refused mid-run.
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    const bool number = end != value.c_str() && *end == '\0';
    params[key] = window_like(key) && number && v >= budget ? std::to_string(std::max(1, budget / 4)) : value;
  }
  return make_policy_config(name, params);  // throws for an unknown name or parameter
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  int depth = 0;
  const auto flush = [&] {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) items.push_back(item);
    item.clear();
  };
  for (char c : text) {
    depth += c == '(' ? 1 : c == ')' ? -1 : 0;
    if (c == ',' && depth == 0) {
      flush();
    } else {
      item += c;
    }
  }
  flush();
  return items;
}

std::vector<std::string> parse_policies(const std::string& text) {
  std::vector<std::string> names;
  for (const std::string& name : split_list(text)) {
    if (name == "all") {
      for (const PolicyInfo& info : policy_catalog()) {
        if (info.name != "full") names.push_back(info.name);
      }
      continue;
    }
    // Throws naming the valid policies, or the policy's parameters; the
    // largest budget, so that only the spec's own values are judged.
    grid_policy_config(name, int32_t(1) << 24);
    names.push_back(name);
  }
  if (names.empty()) throw Error(ErrorCode::kInvalidArgument, "--policies names no policy");
  return names;
}

std::vector<double> parse_budgets(const std::string& text) {
  std::vector<double> budgets;
  for (const std::string& item : split_list(text)) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0 || (v >= 1 && v < 2)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "--budgets: '" + item + "' is not a ratio in (0, 1) or an absolute slot count >= 2");
    }
    budgets.push_back(v);
  }
  if (budgets.empty()) throw Error(ErrorCode::kInvalidArgument, "--budgets names no budget");
  return budgets;
}

}  // namespace lazykv::eval
