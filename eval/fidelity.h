// Fidelity of eviction policies to full attention: a greedy reference
// continuation from the full cache is teacher-forced through every (policy,
// budget) configuration, and each position's logits are compared with the
// full cache's logits at the same position (top-1 agreement, KL divergence).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/batch_runner.h"

namespace lazykv::eval {

struct FidelityOptions {
  int32_t length = 2048;                 // reference continuation length
  std::vector<std::string> policies;     // evicting policies
  std::vector<double> budgets;           // ratios of `length` (< 1) or absolute slots
  int32_t speed_steps = 512;             // decode steps of the unbatched speed run (0: none)
};

struct FidelityConfigResult {
  PolicyConfig policy;         // as run (budget and window rule applied)
  std::string label = "full";  // the --policies spec it came from ("h2o", "h2o(recent=32)")
  double budget_ratio = 1;     // as given; 1 for full
  int32_t budget_slots = 0;    // 0 for full
  int64_t positions = 0;       // compared positions over all prompts
  int64_t agreements = 0;      // positions whose argmax equals the full cache's
  double kl_sum = 0;           // sum over positions of KL(full || policy), nats
  int64_t peak_kv_bytes = 0;   // max over prompts
  int64_t full_peak_kv_bytes = 0;
  int64_t peak_slots_per_head = 0;  // max over prompts and cache heads' counts
  // Time-averaged KV (JobResult::mean_kv_bytes), averaged over prompts, and per cache head in slots.
  double mean_kv_bytes = 0;
  double mean_slots_per_head = 0;
  double policy_seconds = 0;   // summed over prompts
  double decode_tok_s = 0;     // unbatched, first prompt
  TierCounters tiers;          // summed over prompts (tiered policies)

  double top1_agreement() const { return positions ? double(agreements) / double(positions) : 0; }
  double mean_kl() const { return positions ? kl_sum / double(positions) : 0; }
};

struct FidelityReport {
  std::vector<std::vector<int32_t>> continuations;  // the reference continuation of each prompt
  std::vector<FidelityConfigResult> configs;         // `full` first
};

// Runs the whole procedure on already-encoded prompts. A prompt too long for
// the context is an Error(kInvalidArgument) naming it. The runner's batch is
// raised to 2 at least (the full reference steps beside each group of
// configurations). log receives progress lines.
FidelityReport run_fidelity(BatchRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                            const FidelityOptions& options,
                            const std::function<void(const std::string&)>& log = {});

// The result JSON (see docs: model, length, prompts, configs, param_rule).
nlohmann::json fidelity_json(const FidelityReport& report, const std::string& model_name,
                             const FidelityOptions& options, size_t n_prompts, double wall_s);

}  // namespace lazykv::eval
