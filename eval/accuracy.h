// Task accuracy under eviction: every problem is answered greedily with the
// full cache, then with each (policy, budget), the budget a ratio of that
// problem's full-cache length (prompt + full generation, or the generation
// alone with the prompt kept), held equal as the budget C or as the mean or
// peak KV (eval/policy_grid.h). A long run can be stopped and resumed:
// records of an earlier run are reused, not run again.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "eval/answers.h"
#include "eval/batch_runner.h"
#include "eval/datasets.h"
#include "eval/policy_grid.h"

namespace lazykv::eval {

struct AccuracyOptions {
  Dataset dataset = Dataset::kGsm8k;
  Instruction instruction = Instruction::kCot;  // what the caller's prompts ask (reported, and named in records)
  std::vector<std::string> policies;  // evicting policies
  std::vector<double> budgets;        // ratios (< 1) of each problem's full length, or absolute slots
  int32_t max_tokens = 1024;
  BudgetBase budget_base = BudgetBase::kTotal;
  BudgetMatch match = BudgetMatch::kBudget;
  int32_t loop_window = 0;  // Job::loop_window of every job
  bool answer_text = false;  // keep each answer's text in its record
};

// One problem answered by one configuration.
struct AccuracyRecord {
  size_t problem = 0;
  std::string policy;
  double budget_ratio = 1;
  int32_t budget_slots = 0;  // 0 for full
  int64_t generated_tokens = 0;
  std::optional<std::string> prediction;
  bool correct = false;
  int64_t peak_kv_bytes = 0;
  double mean_kv_bytes = 0;  // time-averaged (JobResult::mean_kv_bytes); 0 in records written before it
  // The same per cache head, in slots (0 in records written before them).
  int64_t peak_slots_per_head = 0;
  double mean_slots_per_head = 0;
  TierCounters tiers;        // what a tiered policy moved (zero otherwise)
  std::string finish;        // "stop", "length", "loop" or "error"
  std::string error;         // the job could not run (counted as wrong)
  std::optional<std::string> text;  // the answer, when asked for (AccuracyOptions::answer_text)
};

struct AccuracyRow {
  std::string policy;
  double budget_ratio = 1;
  int64_t correct = 0;
  int64_t n = 0;
  double mean_generated_tokens = 0;
  double mean_peak_kv_bytes = 0;
  int64_t max_peak_kv_bytes = 0;
  double mean_kv_bytes = 0;  // the mean of the answers' time-averaged KV bytes (over those that have it)
  double mean_slots_per_head = 0, mean_peak_slots_per_head = 0;  // the same per cache head, in slots
  int64_t at_length = 0;     // answers that ran to max_tokens
  int64_t loops = 0;         // answers stopped in a repeating cycle
  TierCounters tiers;        // summed over the answers
  int64_t generated = 0;     // tokens generated over the answers

  double accuracy() const { return n ? double(correct) / double(n) : 0; }
};

struct AccuracyReport {
  std::vector<AccuracyRow> rows;          // full first, then policies x budgets in the order given
  std::vector<AccuracyRecord> records;    // every (configuration, problem)
};

// Records of an earlier run and a sink for new ones, so that a run can stop
// at any time and go on later (see eval/accuracy_records.h for the file).
struct AccuracyResume {
  // Reused as they are, matched by (problem, policy, budget_ratio).
  std::vector<AccuracyRecord> done;
  // Called with each new record as soon as its job ends.
  std::function<void(const AccuracyRecord&)> on_record;
};

// prompts[i] is problems[i]'s encoded prompt. Jobs run full first, then
// problem by problem (every configuration of a problem before the next), so
// that an interrupted run leaves whole problems behind.
AccuracyReport run_accuracy(BatchRunner& runner, const std::vector<Problem>& problems,
                            const std::vector<std::vector<int32_t>>& prompts, const AccuracyOptions& options,
                            const std::function<void(const std::string&)>& log = {},
                            const AccuracyResume& resume = {});

nlohmann::json accuracy_json(const AccuracyReport& report, const std::string& model_name,
                             const AccuracyOptions& options, size_t n_problems, double wall_s);

}  // namespace lazykv::eval
