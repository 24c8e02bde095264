// Task accuracy under eviction: every problem is answered greedily with the
// full cache, then with each (policy, budget), the budget a ratio of that
// problem's full-cache length (prompt + full generation).
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

namespace lazykv::eval {

struct AccuracyOptions {
  Dataset dataset = Dataset::kGsm8k;
  std::vector<std::string> policies;  // evicting policies
  std::vector<double> budgets;        // ratios (< 1) of each problem's full length, or absolute slots
  int32_t max_tokens = 1024;
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
  std::string finish;
  std::string error;  // the job could not run (counted as wrong)
};

struct AccuracyRow {
  std::string policy;
  double budget_ratio = 1;
  int64_t correct = 0;
  int64_t n = 0;
  double mean_generated_tokens = 0;
  double mean_peak_kv_bytes = 0;
  int64_t max_peak_kv_bytes = 0;

  double accuracy() const { return n ? double(correct) / double(n) : 0; }
};

struct AccuracyReport {
  std::vector<AccuracyRow> rows;          // full first, then policies x budgets in the order given
  std::vector<AccuracyRecord> records;    // every (configuration, problem)
};

// prompts[i] is problems[i]'s encoded prompt.
AccuracyReport run_accuracy(BatchRunner& runner, const std::vector<Problem>& problems,
                            const std::vector<std::vector<int32_t>>& prompts, const AccuracyOptions& options,
                            const std::function<void(const std::string&)>& log = {});

nlohmann::json accuracy_json(const AccuracyReport& report, const std::string& model_name,
                             const AccuracyOptions& options, size_t n_problems, double wall_s);
// One JSON object per record, with the problem's id and gold answer.
nlohmann::json accuracy_record_json(const AccuracyRecord& record, const std::vector<Problem>& problems);

}  // namespace lazykv::eval
