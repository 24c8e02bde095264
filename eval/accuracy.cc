#include "eval/accuracy.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "common/error.h"
#include "eval/policy_grid.h"
#include "eval/progress.h"

namespace lazykv::eval {
namespace {

AccuracyRecord make_record(size_t problem, const Job& job, const JobResult& result, const Problem& p,
                           const Tokenizer& tokenizer, const AccuracyOptions& options) {
  AccuracyRecord r;
  r.problem = problem;
  r.budget_slots = job.policy.budget();
  r.generated_tokens = int64_t(result.tokens.size());
  r.peak_kv_bytes = result.peak_kv_bytes;
  r.mean_kv_bytes = result.mean_kv_bytes;
  if (result.cache_heads > 0) {
    r.peak_slots_per_head = result.peak_slots / result.cache_heads;
    r.mean_slots_per_head = result.mean_slots / double(result.cache_heads);
  }
  r.tiers = result.tiers;
  r.finish = result.finish;
  r.error = result.error;
  if (result.ok()) {
    const std::string text = tokenizer.decode(result.tokens, /*skip_special=*/true);
    r.prediction = extract_prediction(text, options.dataset);
    r.correct = answer_correct(r.prediction, p.gold, options.dataset);
    if (options.answer_text) r.text = text;
  }
  return r;
}

AccuracyRow summarize(const std::string& policy, double ratio, const std::vector<const AccuracyRecord*>& records) {
  AccuracyRow row;
  row.policy = policy;
  row.budget_ratio = ratio;
  // Memory is averaged over the answers that ran (a failed job held none);
  // the mean KV over those that have it (records written before it was kept
  // have none).
  double tokens = 0, peak_bytes = 0, mean_bytes = 0, mean_slots = 0, peak_slots = 0;
  int64_t ran = 0, with_mean = 0;
  for (const AccuracyRecord* r : records) {
    ++row.n;
    row.correct += r->correct ? 1 : 0;
    row.at_length += r->finish == "length" ? 1 : 0;
    row.loops += r->finish == "loop" ? 1 : 0;
    tokens += double(r->generated_tokens);
    row.generated += r->generated_tokens;
    row.tiers += r->tiers;
    row.max_peak_kv_bytes = std::max(row.max_peak_kv_bytes, r->peak_kv_bytes);
    if (!r->error.empty()) continue;
    ++ran;
    peak_bytes += double(r->peak_kv_bytes);
    if (r->mean_kv_bytes <= 0) continue;
    ++with_mean;
    mean_bytes += r->mean_kv_bytes;
    mean_slots += r->mean_slots_per_head;
    peak_slots += double(r->peak_slots_per_head);
  }
  if (row.n > 0) row.mean_generated_tokens = tokens / double(row.n);
  if (ran > 0) row.mean_peak_kv_bytes = peak_bytes / double(ran);
  if (with_mean > 0) {
    row.mean_kv_bytes = mean_bytes / double(with_mean);
    row.mean_slots_per_head = mean_slots / double(with_mean);
    row.mean_peak_slots_per_head = peak_slots / double(with_mean);
  }
  return row;
}

}  // namespace

AccuracyReport run_accuracy(BatchRunner& runner, const std::vector<Problem>& problems,
                            const std::vector<std::vector<int32_t>>& prompts, const AccuracyOptions& options,
                            const std::function<void(const std::string&)>& log, const AccuracyResume& resume) {
  if (prompts.size() != problems.size()) throw Error(ErrorCode::kInternal, "accuracy: one prompt per problem expected");
  if (options.max_tokens < 1) throw Error(ErrorCode::kInvalidArgument, "--max-tokens must be >= 1");
  const Tokenizer& tokenizer = runner.tokenizer();
  const size_t n = problems.size();

  // Configuration 0 is full; then policies x budgets in the order given.
  std::vector<std::pair<std::string, double>> configs = {{"full", 1.0}};
  for (const std::string& name : options.policies) {
    if (name == "full") continue;  // configuration 0 already: `--policies full` answers with full KV alone
    for (double budget : options.budgets) configs.emplace_back(name, budget);
  }
  using Key = std::tuple<size_t, std::string, double>;  // (problem, policy, budget ratio)
  std::map<Key, AccuracyRecord> records;
  for (const AccuracyRecord& r : resume.done) {
    if (r.problem >= n) throw Error(ErrorCode::kInternal, "accuracy: a resumed record names a problem out of range");
    records.emplace(Key{r.problem, r.policy, r.budget_ratio}, r);
  }
  const auto has = [&](size_t problem, size_t config) {
    return records.contains(Key{problem, configs[config].first, configs[config].second});
  };
  const auto keep = [&](AccuracyRecord r) {
    if (resume.on_record) resume.on_record(r);
    Key key{r.problem, r.policy, r.budget_ratio};
    records.insert_or_assign(std::move(key), std::move(r));
  };
  // Runs jobs[j] for (problem, config) keys[j], keeping each record as its job ends.
  const auto run_jobs = [&](const std::vector<Job>& jobs, const std::vector<std::pair<size_t, size_t>>& keys,
                            const std::string& label) {
    const ProgressCallback print = progress_printer(label, log);
    runner.run(jobs, {}, [&](size_t j, const JobResult& result, size_t done, size_t total) {
      const auto [problem, config] = keys[j];
      AccuracyRecord r = make_record(problem, jobs[j], result, problems[problem], tokenizer, options);
      r.policy = configs[config].first;  // the spec, which tells variants of one policy apart
      r.budget_ratio = configs[config].second;
      keep(std::move(r));
      if (print) print(j, result, done, total);
    });
  };

  // 1. Full cache on every problem.
  std::vector<Job> jobs;
  std::vector<std::pair<size_t, size_t>> keys;
  for (size_t i = 0; i < n; ++i) {
    if (has(i, 0)) continue;
    Job job;
    job.prompt = prompts[i];
    job.policy = make_policy_config(std::string("full"));
    job.max_new_tokens = options.max_tokens;
    job.loop_window = options.loop_window;
    jobs.push_back(std::move(job));
    keys.emplace_back(i, 0);
  }
  if (!jobs.empty()) run_jobs(jobs, keys, "accuracy full");

  // 2. Every (policy, budget) problem by problem; budgets follow each
  // problem's full-cache length.
  jobs.clear();
  keys.clear();
  for (size_t i = 0; i < n; ++i) {
    const AccuracyRecord& full = records.at(Key{i, "full", 1.0});
    for (size_t c = 1; c < configs.size(); ++c) {
      if (has(i, c)) continue;
      const auto& [name, budget] = configs[c];
      if (!full.error.empty()) {  // the same job would fail again: record it without running
        AccuracyRecord r = full;
        r.policy = name;
        r.budget_ratio = budget;
        keep(std::move(r));
        continue;
      }
      Job job;
      job.prompt = prompts[i];
      job.policy = problem_policy_config(name, budget, options.budget_base, options.match, int32_t(prompts[i].size()),
                                         full.generated_tokens);
      job.max_new_tokens = options.max_tokens;
      job.loop_window = options.loop_window;
      jobs.push_back(std::move(job));
      keys.emplace_back(i, c);
    }
  }
  if (!jobs.empty()) run_jobs(jobs, keys, "accuracy policies");

  // Rows and records in configuration order, problems in order within each.
  AccuracyReport report;
  std::vector<const AccuracyRecord*> selected;
  for (const auto& [name, budget] : configs) {
    selected.clear();
    for (size_t i = 0; i < n; ++i) {
      const AccuracyRecord& r = records.at(Key{i, name, budget});
      selected.push_back(&r);
      report.records.push_back(r);
    }
    report.rows.push_back(summarize(name, budget, selected));
  }
  return report;
}

nlohmann::json accuracy_json(const AccuracyReport& report, const std::string& model_name,
                             const AccuracyOptions& options, size_t n_problems, double wall_s) {
  nlohmann::json rows = nlohmann::json::array();
  for (const AccuracyRow& row : report.rows) {
    nlohmann::json tiers;
    if (tiered_spec(row.policy)) tiers = tier_counters_json(row.tiers, double(row.generated));
    rows.push_back({{"policy", row.policy},
                    {"budget_ratio", row.budget_ratio},
                    {"accuracy", row.accuracy()},
                    {"correct", row.correct},
                    {"n", row.n},
                    {"mean_generated_tokens", row.mean_generated_tokens},
                    {"mean_peak_kv_bytes", row.mean_peak_kv_bytes},
                    {"max_peak_kv_bytes", row.max_peak_kv_bytes},
                    {"mean_kv_bytes", row.mean_kv_bytes},
                    {"mean_slots_per_head", row.mean_slots_per_head},
                    {"mean_peak_slots_per_head", row.mean_peak_slots_per_head},
                    {"at_length", row.at_length},
                    {"loops", row.loops}});
    if (!tiers.is_null()) rows.back()["tiers"] = tiers;
  }
  return {{"kind", "accuracy"},
          {"dataset", dataset_name(options.dataset)},
          {"instruction", instruction_name(options.instruction)},
          {"model", model_name},
          {"n", n_problems},
          {"max_tokens", options.max_tokens},
          {"budget_base", budget_base_name(options.budget_base)},
          {"match", budget_match_name(options.match)},
          {"loop_window", options.loop_window},
          {"param_rule", kParamRule},
          {"results", rows},
          {"wall_s", wall_s}};
}

}  // namespace lazykv::eval
