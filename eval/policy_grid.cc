#include "eval/policy_grid.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <utility>

#include "common/error.h"
#include "eval/kv_occupancy.h"

namespace lazykv::eval {

const char* const kParamRule =
    "budget < 1 is a ratio r of the base length: max(8, round(r * base)) slots; >= 1 is absolute slots. With the "
    "prompt kept (budget base 'generated') the base is the answer alone, the prompt's P slots come on top, every "
    "policy has keep_prompt=1, and S below is budget - P (else S is the budget). "
    "The observation/recent window (lazy, lazy+tiers, snapkv, rkv, skipkv, vase, laq `window`; caote, obcache, laq `recent`) is "
    "min(catalog default, max(1, S / 4)), so that at least three quarters of S is chosen by the policy's score; "
    "streaming keeps its 4 sinks and h2o its half-budget recent window (with the prompt kept, max(1, S / 2)). A "
    "window-like value set in a --policies spec, name(param=value), is kept unless it is not below S; then it is "
    "max(1, S / 4) too.";

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

PolicyConfig grid_policy_config(const std::string& spec, int32_t budget, int32_t kept_prompt) {
  const auto [name, given] = split_spec(spec);
  if (name == "full") return make_policy_config(std::string("full"), given);
  std::map<std::string, std::string> params = {{"budget", std::to_string(budget)}};
  // What the window rule divides: the budget, less a kept prompt.
  const int32_t scored = std::max(1, budget - kept_prompt);
  for (const PolicyInfo& info : policy_catalog()) {
    if (info.name != name) continue;
    for (const PolicyParam& p : info.params) {
      if (p.name == "window" || ((name == "caote" || name == "obcache" || name == "laq") && p.name == "recent")) {
        params[p.name] = std::to_string(std::min(int32_t(p.default_value), std::max(1, scored / 4)));
      } else if (p.name == "sinks" && p.default_value >= scored) {
        params[p.name] = std::to_string(std::max(1, scored / 4));
      } else if (p.name == "keep_prompt" && kept_prompt > 0) {
        params[p.name] = std::to_string(1);  // (a literal trips a GCC 12 -Wrestrict false positive)
      } else if (name == "h2o" && p.name == "recent" && kept_prompt > 0) {
        params[p.name] = std::to_string(std::max(1, scored / 2));  // 0 would be half of the whole budget
      }
    }
  }
  for (const auto& [key, value] : given) {
    // A given window that does not fit this budget (budgets follow each
    // problem's length) is cut as the defaults are, not refused mid-run.
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    const bool number = end != value.c_str() && *end == '\0';
    if (name == "h2o" && key == "recent" && number && v == 0 && kept_prompt > 0) continue;  // half, as above
    params[key] = window_like(key) && number && v >= scored ? std::to_string(std::max(1, scored / 4)) : value;
  }
  return make_policy_config(name, params);  // throws for an unknown name or parameter
}

bool tiered_spec(const std::string& spec) { return split_spec(spec).first.ends_with("+tiers"); }

BudgetBase parse_budget_base(const std::string& text) {
  if (text == "total") return BudgetBase::kTotal;
  if (text == "generated") return BudgetBase::kGenerated;
  throw Error(ErrorCode::kInvalidArgument, "--budget-base: '" + text + "' is not total or generated");
}

BudgetMatch parse_budget_match(const std::string& text) {
  if (text == "budget") return BudgetMatch::kBudget;
  if (text == "mean") return BudgetMatch::kMean;
  if (text == "peak") return BudgetMatch::kPeak;
  throw Error(ErrorCode::kInvalidArgument, "--match: '" + text + "' is not budget, mean or peak");
}

const char* budget_base_name(BudgetBase base) { return base == BudgetBase::kTotal ? "total" : "generated"; }

const char* budget_match_name(BudgetMatch match) {
  return match == BudgetMatch::kBudget ? "budget" : match == BudgetMatch::kMean ? "mean" : "peak";
}

PolicyConfig problem_policy_config(const std::string& spec, double budget, BudgetBase base, BudgetMatch match,
                                   int32_t prompt_len, int64_t generated) {
  const bool kept = base == BudgetBase::kGenerated;
  const int64_t target = kept ? prompt_len + budget_slots(budget, generated)
                              : budget_slots(budget, int64_t(prompt_len) + generated);
  const int32_t kept_prompt = kept ? prompt_len : 0;
  const auto at = [&](int64_t c) { return grid_policy_config(spec, int32_t(c), kept_prompt); };
  if (match == BudgetMatch::kBudget || split_spec(spec).first == "full") return at(target);
  const int64_t G = std::max<int64_t>(generated, 1);
  const auto accepts = [&](int64_t c) { return prompt_refusal(at(c), prompt_len).empty(); };
  const auto fits = [&](int64_t c) {
    if (!accepts(c)) return false;
    const KvOccupancy o = kv_occupancy(at(c), prompt_len, int32_t(G));
    return (match == BudgetMatch::kMean ? o.mean : double(o.peak)) <= double(target);
  };
  // What every policy holds at least: a pass sees min(P + t, C) slots or more
  // (no compaction goes below C), and some pass C + 1 once the sequence
  // passes C. Only budgets whose bound fits can fit.
  const auto bound = [&](int64_t c) {
    if (match == BudgetMatch::kPeak) return double(std::min<int64_t>(c + 1, prompt_len + G - 1));
    double sum = 0;
    for (int64_t t = 0; t < G; ++t) sum += double(std::min<int64_t>(prompt_len + t, c));
    return sum / double(G);
  };
  // Past P + G no budget evicts within the answer: every larger C holds the same.
  const int64_t top = std::max<int64_t>(target, int64_t(prompt_len) + G + 1);
  if (fits(top)) return at(top);
  int64_t lo = 2, hi = top;  // the largest C whose bound fits (the bound grows with C)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (bound(mid) <= double(target)) lo = mid; else hi = mid - 1;
  }
  // The occupancy itself does not always grow with C (a window that follows
  // C moves the next multiple of it), nor does acceptance when a spec fixes
  // a window: so a scan, down from the bound (within a window or so of it).
  for (int64_t c = lo; c >= 2; --c) {
    if (fits(c)) return at(c);
  }
  // Nothing fits (raas keeps a prompt longer than the target): the smallest accepted budget.
  for (int64_t c = 2; c <= top; ++c) {
    if (accepts(c)) return at(c);
  }
  return at(target);  // refused at any budget: the job reports why
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

std::vector<std::string> parse_policies(const std::string& text, bool episodic) {
  std::vector<std::string> names;
  for (const std::string& name : split_list(text)) {
    if (name == "all") {
      for (const PolicyInfo& info : policy_catalog()) {
        if (info.name != "full" && !info.episodic) names.push_back(info.name);
      }
      continue;
    }
    // Throws naming the valid policies, or the policy's parameters; the
    // largest budget, so that only the spec's own values are judged.
    const PolicyConfig config = grid_policy_config(name, int32_t(1) << 24);
    const auto info = std::find_if(policy_catalog().begin(), policy_catalog().end(),
                                   [&](const PolicyInfo& p) { return p.name == config.name; });
    if (!episodic && info->episodic) {
      throw Error(ErrorCode::kInvalidArgument,
                  "--policies: " + config.name + " needs a conversation routed to an episode: lazykv eval conversation");
    }
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
