// The (policy, budget) grid an evaluation sweeps: budgets given as ratios or
// absolute slots, and the rule that shrinks window-like parameters to fit
// small budgets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/policy_config.h"

namespace lazykv::eval {

// How window-like parameters are set (written into the result JSON).
extern const char* const kParamRule;

// Slots for a budget value: a value < 1 is a ratio of `base` tokens,
// max(8, round(value * base)); a value >= 1 is an absolute slot count.
int32_t budget_slots(double budget, int64_t base);

// The policy of a spec, `name` or `name(param=value,...)`, with this budget.
// Window-like parameters (lazy/snapkv/rkv "window", caote/obcache "recent",
// streaming "sinks") follow kParamRule: catalog defaults, or the spec's
// values, unless too large for the budget. `full` ignores the budget; a spec
// may not set `budget` (the grid does) or have empty parentheses.
PolicyConfig grid_policy_config(const std::string& spec, int32_t budget);

// "a,b(x=1,y=2),c" -> {"a", "b(x=1,y=2)", "c"}: commas inside parentheses
// do not split; empty items are dropped.
std::vector<std::string> split_list(const std::string& text);
// Policy specs (see grid_policy_config), each checked against the catalog
// ("all" = every evicting policy).
std::vector<std::string> parse_policies(const std::string& text);
// Budget values, each > 0 (ratios < 1, absolute slots >= 2 otherwise).
std::vector<double> parse_budgets(const std::string& text);

}  // namespace lazykv::eval
