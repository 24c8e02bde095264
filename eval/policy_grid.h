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
// may not set `budget` (the grid does) or have empty parentheses. With
// kept_prompt > 0 the policy keeps the prompt (keep_prompt=1 unless the spec
// says otherwise; raas always does) and the rule applies to what the prompt
// leaves of the budget (h2o's recent window is half of that).
PolicyConfig grid_policy_config(const std::string& spec, int32_t budget, int32_t kept_prompt = 0);

// What a --budgets value is a ratio of: the full-cache length (prompt plus
// the full-cache answer), or the full-cache answer alone, with the prompt
// kept and counted in the budget on top (the LazyEviction paper's setting).
enum class BudgetBase { kTotal, kGenerated };
// What is held equal across policies at one budget value: the budget C
// (slots after a compaction), or the mean or the peak slots per cache head
// over the full-cache answer's length (C chosen per policy, eval/kv_occupancy.h).
enum class BudgetMatch { kBudget, kMean, kPeak };
BudgetBase parse_budget_base(const std::string& text);  // "total" or "generated"
BudgetMatch parse_budget_match(const std::string& text);  // "budget", "mean" or "peak"
const char* budget_base_name(BudgetBase base);
const char* budget_match_name(BudgetMatch match);

// The policy of `spec` at budget value `budget` for a problem of prompt_len
// prompt tokens whose full-cache answer has `generated` tokens. The target
// is budget_slots(budget, P + G) slots (kTotal) or P + budget_slots(budget,
// G) (kGenerated); kBudget makes it C; kMean / kPeak choose the largest C
// whose modelled mean / peak is at most the target (the smallest C the
// policy accepts when none is).
PolicyConfig problem_policy_config(const std::string& spec, double budget, BudgetBase base, BudgetMatch match,
                                   int32_t prompt_len, int64_t generated);

// True for a spec of a policy that moves KV between tiers (lazy+tiers).
bool tiered_spec(const std::string& spec);

// "a,b(x=1,y=2),c" -> {"a", "b(x=1,y=2)", "c"}: commas inside parentheses
// do not split; empty items are dropped.
std::vector<std::string> split_list(const std::string& text);
// Policy specs (see grid_policy_config), each checked against the catalog
// ("all" = every evicting policy but the episodic ones, which need a
// conversation: epicache; naming one is an error unless `episodic`).
std::vector<std::string> parse_policies(const std::string& text, bool episodic = false);
// Budget values, each > 0 (ratios < 1, absolute slots >= 2 otherwise).
std::vector<double> parse_budgets(const std::string& text);

}  // namespace lazykv::eval
