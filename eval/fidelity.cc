#include "eval/fidelity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>
#include <unordered_map>

#include "common/error.h"
#include "eval/policy_grid.h"
#include "eval/progress.h"
#include "worker/sampler.h"

namespace lazykv::eval {
namespace {

double log_sum_exp(std::span<const float> x) {
  double m = -INFINITY;
  for (float v : x) m = std::max(m, double(v));
  double s = 0;
  for (float v : x) s += std::exp(double(v) - m);
  return m + std::log(s);
}

// The full cache's distribution at one position of one group, kept until
// every configuration of the group has been compared with it.
struct Reference {
  bool ready = false;
  std::vector<double> logp, p;
  int32_t top = 0;
  size_t remaining = 0;  // configurations not yet compared
  std::vector<std::pair<size_t, std::vector<float>>> pending;  // (config, logits) that came first
};

struct Group {
  size_t prompt = 0;
  std::vector<size_t> configs;
};

}  // namespace

FidelityReport run_fidelity(BatchRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                            const FidelityOptions& options, const std::function<void(const std::string&)>& log) {
  if (prompts.empty()) throw Error(ErrorCode::kInvalidArgument, "fidelity: no prompts");
  if (options.length < 1) throw Error(ErrorCode::kInvalidArgument, "fidelity: --length must be >= 1");
  FidelityReport report;
  FidelityConfigResult full;
  full.policy = make_policy_config(std::string("full"));
  report.configs.push_back(full);
  for (const std::string& name : options.policies) {
    for (double budget : options.budgets) {
      FidelityConfigResult c;
      c.budget_ratio = budget;
      c.budget_slots = budget_slots(budget, options.length);
      c.policy = grid_policy_config(name, c.budget_slots);
      c.label = name;
      report.configs.push_back(c);
    }
  }
  std::vector<FidelityConfigResult>& configs = report.configs;

  // 1. The reference continuations: greedy, full cache, exactly `length` tokens.
  std::vector<Job> jobs;
  for (const std::vector<int32_t>& prompt : prompts) {
    Job job;
    job.prompt = prompt;
    job.policy = full.policy;
    job.max_new_tokens = options.length;
    job.ban_eos = true;
    jobs.push_back(std::move(job));
  }
  std::vector<JobResult> results = runner.run(jobs, {}, progress_printer("fidelity reference", log));
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      throw Error(ErrorCode::kInvalidArgument, "fidelity: prompt " + std::to_string(i) + ": " + results[i].error);
    }
    report.continuations.push_back(results[i].tokens);
  }

  // 2. Teacher forcing: groups of configurations, each stepping beside its own
  // full-cache job so that the reference logits of a position are needed only
  // briefly (one group runs at a time, all its jobs in lockstep).
  const int saved_batch = runner.batch();
  const int batch = std::max(2, saved_batch);
  runner.set_batch(batch);
  const size_t per_group_max = size_t(batch - 1);
  const size_t n_groups_per_prompt = (configs.size() + per_group_max - 1) / per_group_max;
  const size_t per_group = (configs.size() + n_groups_per_prompt - 1) / n_groups_per_prompt;
  std::vector<Group> groups;
  jobs.clear();
  std::vector<size_t> job_group, job_config;  // job_config: SIZE_MAX for a group's reference job
  constexpr size_t kReference = SIZE_MAX;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (size_t first = 0; first < configs.size(); first += per_group) {
      Group g;
      g.prompt = p;
      Job ref;
      ref.prompt = prompts[p];
      ref.policy = full.policy;
      ref.forced = report.continuations[p];
      ref.wait_for_idle = true;
      jobs.push_back(ref);
      job_group.push_back(groups.size());
      job_config.push_back(kReference);
      for (size_t c = first; c < std::min(configs.size(), first + per_group); ++c) {
        Job job;
        job.prompt = prompts[p];
        job.policy = configs[c].policy;
        job.forced = report.continuations[p];
        jobs.push_back(std::move(job));
        job_group.push_back(groups.size());
        job_config.push_back(c);
        g.configs.push_back(c);
      }
      groups.push_back(std::move(g));
    }
  }

  std::unordered_map<int64_t, Reference> references;  // key: group * length + index
  const auto compare = [&](size_t config, const Reference& ref, std::span<const float> logits) {
    FidelityConfigResult& c = configs[config];
    ++c.positions;
    if (argmax(logits) == ref.top) ++c.agreements;
    const double lse = log_sum_exp(logits);
    double kl = 0;
    for (size_t v = 0; v < logits.size(); ++v) {
      if (ref.p[v] > 0) kl += ref.p[v] * (ref.logp[v] - (double(logits[v]) - lse));
    }
    c.kl_sum += std::max(0.0, kl);
  };
  const auto on_logits = [&](size_t job, int32_t index, std::span<const float> logits) {
    const size_t g = job_group[job];
    const int64_t key = int64_t(g) * options.length + index;
    auto [it, inserted] = references.try_emplace(key);
    Reference& ref = it->second;
    if (inserted) ref.remaining = groups[g].configs.size();
    if (job_config[job] == kReference) {
      const double lse = log_sum_exp(logits);
      ref.logp.resize(logits.size());
      ref.p.resize(logits.size());
      for (size_t v = 0; v < logits.size(); ++v) {
        ref.logp[v] = double(logits[v]) - lse;
        ref.p[v] = std::exp(ref.logp[v]);
      }
      ref.top = argmax(logits);
      ref.ready = true;
      for (const auto& [config, pending] : ref.pending) compare(config, ref, pending);
      ref.remaining -= ref.pending.size();
      ref.pending.clear();
    } else if (ref.ready) {
      compare(job_config[job], ref, logits);
      --ref.remaining;
    } else {
      ref.pending.emplace_back(job_config[job], std::vector<float>(logits.begin(), logits.end()));
    }
    if (ref.ready && ref.remaining == 0) references.erase(it);
  };
  try {
    results = runner.run(jobs, on_logits, progress_printer("fidelity teacher forcing", log));
  } catch (...) {
    runner.set_batch(saved_batch);
    throw;
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (!results[j].ok()) throw Error(ErrorCode::kInternal, "fidelity: a teacher-forced job failed: " + results[j].error);
    if (job_config[j] == kReference) {
      for (FidelityConfigResult& c : configs) c.full_peak_kv_bytes = std::max(c.full_peak_kv_bytes, results[j].peak_kv_bytes);
      continue;
    }
    FidelityConfigResult& c = configs[job_config[j]];
    const JobResult& r = results[j];
    c.peak_kv_bytes = std::max(c.peak_kv_bytes, r.peak_kv_bytes);
    c.peak_slots_per_head = std::max(c.peak_slots_per_head, r.peak_slots / std::max<int64_t>(r.cache_heads, 1));
    c.mean_kv_bytes += r.mean_kv_bytes / double(prompts.size());  // one job per prompt
    c.mean_slots_per_head += r.mean_slots / double(std::max<int64_t>(r.cache_heads, 1)) / double(prompts.size());
    c.policy_seconds += r.policy_seconds;
    c.tiers += r.tiers;
  }

  // 3. Speed: each configuration alone over the start of the first continuation.
  if (options.speed_steps > 0) {
    runner.set_batch(1);
    jobs.clear();
    const size_t steps = std::min(size_t(options.speed_steps), report.continuations[0].size());
    for (const FidelityConfigResult& c : configs) {
      Job job;
      job.prompt = prompts[0];
      job.policy = c.policy;
      job.forced.assign(report.continuations[0].begin(), report.continuations[0].begin() + ptrdiff_t(steps));
      jobs.push_back(std::move(job));
    }
    try {
      results = runner.run(jobs, {}, progress_printer("fidelity speed", log));
    } catch (...) {
      runner.set_batch(saved_batch);
      throw;
    }
    for (size_t c = 0; c < configs.size(); ++c) {
      const JobResult& r = results[c];
      configs[c].decode_tok_s = r.decode_seconds > 0 ? double(r.decode_steps) / r.decode_seconds : 0;
    }
  }
  runner.set_batch(saved_batch);
  return report;
}

nlohmann::json fidelity_json(const FidelityReport& report, const std::string& model_name,
                             const FidelityOptions& options, size_t n_prompts, double wall_s) {
  nlohmann::json configs = nlohmann::json::array();
  for (const FidelityConfigResult& c : report.configs) {
    configs.push_back({{"policy", c.label},
                       {"params", c.policy.to_json()},
                       {"budget_ratio", c.budget_ratio},
                       {"budget_slots", c.budget_slots},
                       {"top1_agreement", c.top1_agreement()},
                       {"mean_kl", c.mean_kl()},
                       {"positions", c.positions},
                       {"peak_kv_bytes", c.peak_kv_bytes},
                       {"full_peak_kv_bytes", c.full_peak_kv_bytes},
                       {"peak_slots_per_head", c.peak_slots_per_head},
                       {"mean_kv_bytes", c.mean_kv_bytes},
                       {"mean_slots_per_head", c.mean_slots_per_head},
                       {"decode_tok_s", c.decode_tok_s},
                       {"policy_seconds", c.policy_seconds}});
    if (c.policy.name.ends_with("+tiers")) configs.back()["tiers"] = tier_counters_json(c.tiers, double(c.positions));
  }
  return {{"kind", "fidelity"},
          {"model", model_name},
          {"length", options.length},
          {"prompts", n_prompts},
          {"speed_steps", options.speed_steps},
          {"param_rule", kParamRule},
          {"configs", configs},
          {"wall_s", wall_s}};
}

}  // namespace lazykv::eval
