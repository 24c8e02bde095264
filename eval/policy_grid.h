// The (policy, budget) grid an evaluation sweeps: budgets given as ratios or
// absolute slots, and the rule that shrinks window-like parameters to fit
// small budgets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/policy/policy_config.h"

namespace lazykv::eval {

// How window-like parameters are set (written into the result JSON).
extern const char* const kParamRule;

// Slots for a budget value: a value < 1 is a ratio of `base` tokens,
// max(8, round(value * base)); a value >= 1 is an absolute slot count.
int32_t budget_slots(double budget, int64_t base);

// The policy with this budget; window-like parameters (lazy/snapkv/rkv
// "window", h2o "recent", streaming "sinks") keep their catalog defaults
// unless that is not smaller than the budget, then max(1, budget / 4).
// `full` ignores the budget.
PolicyConfig grid_policy_config(const std::string& name, int32_t budget);

// "a,b,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_list(const std::string& text);
// Policy names, each checked against the catalog ("all" = every evicting policy).
std::vector<std::string> parse_policies(const std::string& text);
// Budget values, each > 0 (ratios < 1, absolute slots >= 2 otherwise).
std::vector<double> parse_budgets(const std::string& text);

}  // namespace lazykv::eval
