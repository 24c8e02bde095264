#include "eval/accuracy.h"

#include <algorithm>

#include "common/error.h"
#include "eval/policy_grid.h"
#include "eval/progress.h"

namespace lazykv::eval {
namespace {

AccuracyRecord make_record(size_t problem, const Job& job, const JobResult& result, const Problem& p,
                           const Tokenizer& tokenizer, Dataset dataset) {
  AccuracyRecord r;
  r.problem = problem;
  r.policy = job.policy.name;
  r.budget_slots = job.policy.budget();
  r.generated_tokens = int64_t(result.tokens.size());
  r.peak_kv_bytes = result.peak_kv_bytes;
  r.finish = result.finish;
  r.error = result.error;
  if (result.ok()) {
    r.prediction = extract_prediction(tokenizer.decode(result.tokens, /*skip_special=*/true), dataset);
    r.correct = answer_correct(r.prediction, p.gold, dataset);
  }
  return r;
}

AccuracyRow summarize(const std::string& policy, double ratio, const std::vector<const AccuracyRecord*>& records) {
  AccuracyRow row;
  row.policy = policy;
  row.budget_ratio = ratio;
  double tokens = 0, bytes = 0;
  for (const AccuracyRecord* r : records) {
    ++row.n;
    row.correct += r->correct ? 1 : 0;
    tokens += double(r->generated_tokens);
    bytes += double(r->peak_kv_bytes);
    row.max_peak_kv_bytes = std::max(row.max_peak_kv_bytes, r->peak_kv_bytes);
  }
  if (row.n > 0) {
    row.mean_generated_tokens = tokens / double(row.n);
    row.mean_peak_kv_bytes = bytes / double(row.n);
  }
  return row;
}

}  // namespace

AccuracyReport run_accuracy(BatchRunner& runner, const std::vector<Problem>& problems,
                            const std::vector<std::vector<int32_t>>& prompts, const AccuracyOptions& options,
                            const std::function<void(const std::string&)>& log) {
  if (prompts.size() != problems.size()) throw Error(ErrorCode::kInternal, "accuracy: one prompt per problem expected");
  if (options.max_tokens < 1) throw Error(ErrorCode::kInvalidArgument, "--max-tokens must be >= 1");
  const Tokenizer& tokenizer = runner.tokenizer();
  AccuracyReport report;

  // 1. Full cache on every problem.
  std::vector<Job> jobs;
  for (const std::vector<int32_t>& prompt : prompts) {
    Job job;
    job.prompt = prompt;
    job.policy = make_policy_config(std::string("full"));
    job.max_new_tokens = options.max_tokens;
    jobs.push_back(std::move(job));
  }
  std::vector<JobResult> full = runner.run(jobs, {}, progress_printer("accuracy full", log));
  std::vector<AccuracyRecord> full_records;
  for (size_t i = 0; i < problems.size(); ++i) {
    full_records.push_back(make_record(i, jobs[i], full[i], problems[i], tokenizer, options.dataset));
  }

  // 2. Every (policy, budget, problem) in one queue; budgets follow each
  // problem's full-cache length.
  std::vector<Job> policy_jobs;
  std::vector<std::pair<size_t, size_t>> job_key;  // (config index, problem)
  std::vector<std::pair<std::string, double>> grid;
  std::vector<AccuracyRecord> policy_records;
  for (const std::string& name : options.policies) {
    for (double budget : options.budgets) {
      const size_t config = grid.size();
      grid.emplace_back(name, budget);
      for (size_t i = 0; i < problems.size(); ++i) {
        if (!full[i].ok()) {  // the same job would fail again: record it without running
          AccuracyRecord r = full_records[i];
          r.policy = name;
          r.budget_ratio = budget;
          policy_records.push_back(r);
          continue;
        }
        const int64_t total = int64_t(prompts[i].size() + full[i].tokens.size());
        Job job;
        job.prompt = prompts[i];
        job.policy = grid_policy_config(name, budget_slots(budget, total));
        job.max_new_tokens = options.max_tokens;
        policy_jobs.push_back(std::move(job));
        job_key.emplace_back(config, i);
      }
    }
  }
  const std::vector<JobResult> results = runner.run(policy_jobs, {}, progress_printer("accuracy policies", log));
  for (size_t j = 0; j < policy_jobs.size(); ++j) {
    const auto [config, i] = job_key[j];
    AccuracyRecord r = make_record(i, policy_jobs[j], results[j], problems[i], tokenizer, options.dataset);
    r.budget_ratio = grid[config].second;
    policy_records.push_back(r);
  }

  // Rows: full first, then the grid in the order given.
  std::vector<const AccuracyRecord*> selected;
  for (const AccuracyRecord& r : full_records) selected.push_back(&r);
  report.rows.push_back(summarize("full", 1.0, selected));
  for (const auto& [name, budget] : grid) {
    selected.clear();
    for (const AccuracyRecord& r : policy_records) {
      if (r.policy == name && r.budget_ratio == budget) selected.push_back(&r);
    }
    report.rows.push_back(summarize(name, budget, selected));
  }
  report.records = std::move(full_records);
  report.records.insert(report.records.end(), policy_records.begin(), policy_records.end());
  return report;
}

nlohmann::json accuracy_json(const AccuracyReport& report, const std::string& model_name,
                             const AccuracyOptions& options, size_t n_problems, double wall_s) {
  nlohmann::json rows = nlohmann::json::array();
  for (const AccuracyRow& row : report.rows) {
    rows.push_back({{"policy", row.policy},
                    {"budget_ratio", row.budget_ratio},
                    {"accuracy", row.accuracy()},
                    {"correct", row.correct},
                    {"n", row.n},
                    {"mean_generated_tokens", row.mean_generated_tokens},
                    {"mean_peak_kv_bytes", row.mean_peak_kv_bytes},
                    {"max_peak_kv_bytes", row.max_peak_kv_bytes}});
  }
  return {{"kind", "accuracy"},
          {"dataset", dataset_name(options.dataset)},
          {"model", model_name},
          {"n", n_problems},
          {"max_tokens", options.max_tokens},
          {"param_rule", kParamRule},
          {"results", rows},
          {"wall_s", wall_s}};
}

nlohmann::json accuracy_record_json(const AccuracyRecord& record, const std::vector<Problem>& problems) {
  const Problem& p = problems[record.problem];
  nlohmann::json j = {{"id", p.id},
                      {"policy", record.policy},
                      {"budget_ratio", record.budget_ratio},
                      {"budget_slots", record.budget_slots},
                      {"gold", p.gold},
                      {"prediction", record.prediction ? nlohmann::json(*record.prediction) : nlohmann::json(nullptr)},
                      {"correct", record.correct},
                      {"generated_tokens", record.generated_tokens},
                      {"peak_kv_bytes", record.peak_kv_bytes},
                      {"finish", record.finish}};
  if (!record.error.empty()) j["error"] = record.error;
  return j;
}

}  // namespace lazykv::eval
