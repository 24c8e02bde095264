// The batched runner, fidelity and accuracy drivers on a tiny random model.
#include "eval/batch_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "eval/accuracy.h"
#include "eval/accuracy_records.h"
#include "eval/fidelity.h"
#include "eval/kv_occupancy.h"
#include "eval/policy_grid.h"
#include "tests/unit/temp_dir.h"
#include "tests/unit/eval/tiny_eval_model.h"
#include "worker/model.h"

namespace lazykv::eval {
namespace {


class BatchRunnerTest : public TinyEvalModelTest {
 protected:
  static void SetUpTestSuite() { load("eval_test", 256); }

  // Prompts of different lengths and contents (ids of byte tokens).
  static std::vector<int32_t> prompt(int i) {
    std::vector<int32_t> ids = {1};
    for (int k = 0; k < 6 + 3 * i; ++k) ids.push_back(3 + (17 * i + 5 * k) % 250);
    return ids;
  }

  static Job job(int i, PolicyConfig policy, int32_t max_new, bool ban_eos = true) {
    Job j;
    j.prompt = prompt(i);
    j.policy = std::move(policy);
    j.max_new_tokens = max_new;
    j.ban_eos = ban_eos;
    return j;
  }
};

TEST_F(BatchRunnerTest, BatchedGenerationEqualsEachPromptAlone) {
  // Mixed policies: the evicting ones compact while other sequences decode beside them.
  const std::vector<PolicyConfig> policies = {
      make_policy_config(std::string("full")), grid_policy_config("lazy", 12), grid_policy_config("streaming", 10),
      grid_policy_config("h2o", 12), make_policy_config(std::string("full"))};
  std::vector<Job> jobs;
  for (int i = 0; i < 5; ++i) jobs.push_back(job(i, policies[size_t(i)], 20 + 3 * i));
  BatchRunner batched = runner(2);
  const std::vector<JobResult> together = batched.run(jobs);
  ASSERT_EQ(together.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    BatchRunner single = runner(1);
    const std::vector<JobResult> alone = single.run({jobs[size_t(i)]});
    ASSERT_TRUE(together[size_t(i)].ok()) << together[size_t(i)].error;
    EXPECT_EQ(together[size_t(i)].tokens, alone[0].tokens) << "job " << i;
    EXPECT_EQ(together[size_t(i)].tokens.size(), size_t(20 + 3 * i)) << "ban_eos runs to max_new_tokens";
    EXPECT_EQ(together[size_t(i)].finish, "length");
    EXPECT_EQ(together[size_t(i)].peak_kv_bytes, alone[0].peak_kv_bytes);
    EXPECT_GT(together[size_t(i)].peak_kv_bytes, 0);
  }
  // The evicting policies did evict (so the comparison covered compaction).
  EXPECT_GT(together[1].evicted_slots, 0);
  EXPECT_GT(together[2].evicted_slots, 0);
  EXPECT_EQ(together[0].evicted_slots, 0);
}

TEST_F(BatchRunnerTest, StopsAtEndOfGenerationUnlessBanned) {
  // Force the reference to find where the model emits an end-of-generation
  // token, if it ever does; with ban_eos the job always runs to the limit.
  BatchRunner r = runner(4);
  std::vector<Job> jobs;
  for (int i = 0; i < 4; ++i) jobs.push_back(job(i, make_policy_config(std::string("full")), 60, /*ban_eos=*/false));
  const std::vector<JobResult> results = r.run(jobs);
  for (const JobResult& res : results) {
    ASSERT_TRUE(res.ok());
    for (size_t k = 0; k + 1 < res.tokens.size(); ++k) EXPECT_FALSE(tokenizer_->is_end_of_generation(res.tokens[k]));
    if (res.finish == "stop") {
      EXPECT_TRUE(tokenizer_->is_end_of_generation(res.tokens.back()));
    } else {
      EXPECT_EQ(res.tokens.size(), 60u);
    }
  }
}

// Greedy decoding of the tiny random model falls into short cycles; with a
// loop window the job stops there ("loop") with the same tokens so far, and
// the tokens it stopped on repeat a block of at most window / 4.
TEST_F(BatchRunnerTest, ALoopWindowStopsARepeatingAnswer) {
  constexpr int32_t kWindow = 16, kMax = 150;
  BatchRunner r = runner(4);
  std::vector<Job> plain, watched;
  for (int i = 0; i < 4; ++i) {
    plain.push_back(job(i, make_policy_config(std::string("full")), kMax));
    watched.push_back(plain.back());
    watched.back().loop_window = kWindow;
  }
  const std::vector<JobResult> runs = r.run(plain), stopped = r.run(watched);
  int loops = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    ASSERT_TRUE(runs[i].ok() && stopped[i].ok());
    EXPECT_EQ(runs[i].finish, "length");
    const std::vector<int32_t>& t = stopped[i].tokens;
    ASSERT_LE(t.size(), runs[i].tokens.size());
    EXPECT_TRUE(std::equal(t.begin(), t.end(), runs[i].tokens.begin())) << "job " << i;
    if (stopped[i].finish != "loop") {
      EXPECT_EQ(t.size(), size_t(kMax));
      continue;
    }
    ++loops;
    ASSERT_GE(t.size(), size_t(kWindow));
    bool periodic = false;
    for (size_t p = 1; p <= kWindow / 4 && !periodic; ++p) {
      periodic = std::equal(t.end() - kWindow + int(p), t.end(), t.end() - kWindow);
    }
    EXPECT_TRUE(periodic) << "job " << i << " stopped without a cycle";
    // It stopped at the first token that closed the window, not later.
    const std::vector<int32_t> before(t.begin(), t.end() - 1);
    for (size_t p = 1; p <= kWindow / 4 && before.size() >= kWindow; ++p) {
      EXPECT_FALSE(std::equal(before.end() - kWindow + int(p), before.end(), before.end() - kWindow)) << "job " << i;
    }
  }
  EXPECT_GT(loops, 0) << "no job of the tiny model looped";
}

TEST_F(BatchRunnerTest, TeacherForcingFeedsExactlyTheForcedTokens) {
  // Forced tokens that greedy decoding would not produce: each position's
  // logits must be those of the prompt followed by the forced prefix.
  Job forced = job(1, make_policy_config(std::string("full")), 0);
  for (int k = 0; k < 8; ++k) forced.forced.push_back(3 + (31 * k + 7) % 250);
  std::vector<std::vector<float>> seen;
  BatchRunner r = runner(3);
  const std::vector<JobResult> results =
      r.run({job(0, make_policy_config(std::string("full")), 5), forced, job(2, make_policy_config(std::string("full")), 9)},
            [&](size_t j, int32_t index, std::span<const float> logits) {
              if (j != 1) return;
              EXPECT_EQ(index, int32_t(seen.size()));
              seen.emplace_back(logits.begin(), logits.end());
            });
  ASSERT_TRUE(results[1].ok());
  EXPECT_EQ(results[1].tokens, forced.forced);
  ASSERT_EQ(seen.size(), forced.forced.size());
  for (size_t i = 0; i < forced.forced.size(); ++i) {
    Job prefix = job(1, make_policy_config(std::string("full")), 1);
    prefix.prompt.insert(prefix.prompt.end(), forced.forced.begin(), forced.forced.begin() + ptrdiff_t(i));
    std::vector<float> expected;
    BatchRunner single = runner(1);
    single.run({prefix}, [&](size_t, int32_t, std::span<const float> logits) { expected.assign(logits.begin(), logits.end()); });
    ASSERT_EQ(expected.size(), seen[i].size());
    for (size_t v = 0; v < expected.size(); ++v) ASSERT_NEAR(seen[i][v], expected[v], 1e-3) << "position " << i;
  }
}

TEST_F(BatchRunnerTest, AJobTooLongForTheContextFailsAlone) {
  BatchRunner r = runner(2);
  Job too_long = job(0, make_policy_config(std::string("full")), 250);  // 7 prompt tokens + 250 > 256
  Job bad_token = job(1, make_policy_config(std::string("full")), 4);
  bad_token.prompt.push_back(1 << 20);
  const std::vector<JobResult> results =
      r.run({job(2, make_policy_config(std::string("full")), 6), too_long, bad_token, job(3, grid_policy_config("lazy", 9), 6)});
  EXPECT_TRUE(results[0].ok());
  EXPECT_EQ(results[0].tokens.size(), 6u);
  EXPECT_FALSE(results[1].ok());
  EXPECT_EQ(results[1].finish, "error");
  EXPECT_NE(results[1].error.find("exceeds the context of 256 tokens"), std::string::npos) << results[1].error;
  EXPECT_TRUE(results[1].tokens.empty());
  EXPECT_FALSE(results[2].ok());
  EXPECT_NE(results[2].error.find("outside the vocabulary"), std::string::npos) << results[2].error;
  EXPECT_TRUE(results[3].ok());
  EXPECT_EQ(results[3].tokens.size(), 6u);
}

TEST_F(BatchRunnerTest, FullAgainstFullIsPerfectFidelity) {
  BatchRunner r = runner(3);
  FidelityOptions options;
  options.length = 24;
  options.speed_steps = 8;
  options.policies = {"lazy", "streaming", "streaming(sinks=1)"};
  options.budgets = {1000, 0.25};  // 1000 slots: more than the whole sequence, nothing is evicted
  const FidelityReport report = run_fidelity(r, {prompt(0), prompt(3)}, options);
  ASSERT_EQ(report.configs.size(), 7u);
  ASSERT_EQ(report.continuations.size(), 2u);
  EXPECT_EQ(report.continuations[0].size(), 24u);
  const FidelityConfigResult& full = report.configs[0];
  EXPECT_EQ(full.policy.name, "full");
  EXPECT_EQ(full.positions, 48);
  EXPECT_EQ(full.top1_agreement(), 1.0);
  EXPECT_EQ(full.mean_kl(), 0.0);
  EXPECT_GT(full.decode_tok_s, 0);
  const FidelityConfigResult& roomy = report.configs[1];
  EXPECT_EQ(roomy.policy.name, "lazy");
  EXPECT_EQ(roomy.budget_slots, 1000);
  EXPECT_EQ(roomy.positions, 48);
  EXPECT_EQ(roomy.top1_agreement(), 1.0);
  EXPECT_NEAR(roomy.mean_kl(), 0.0, 1e-9);
  EXPECT_EQ(roomy.peak_kv_bytes, roomy.full_peak_kv_bytes);
  // A tight budget evicts: less memory, window rule applied (8 slots: window 2).
  const FidelityConfigResult& tight = report.configs[2];
  EXPECT_EQ(tight.budget_slots, 8);
  EXPECT_EQ(tight.policy.get_int("window"), 2);
  EXPECT_LT(tight.peak_kv_bytes, tight.full_peak_kv_bytes);
  EXPECT_GE(tight.mean_kl(), 0.0);
  // Mean KV: the modelled occupancy of each prompt's forced run, averaged.
  double modelled = 0;
  int32_t modelled_peak = 0;
  for (const std::vector<int32_t>& p : {prompt(0), prompt(3)}) {
    const KvOccupancy o = kv_occupancy(tight.policy, int32_t(p.size()), 24);
    modelled += o.mean / 2;
    modelled_peak = std::max(modelled_peak, o.peak);
  }
  EXPECT_DOUBLE_EQ(tight.mean_slots_per_head, modelled);
  EXPECT_EQ(tight.peak_slots_per_head, modelled_peak);
  EXPECT_LT(tight.mean_kv_bytes, roomy.mean_kv_bytes);
  EXPECT_EQ(roomy.mean_kv_bytes, full.mean_kv_bytes);
  // A variant of a policy is its own configuration, labelled by its spec.
  EXPECT_EQ(report.configs[3].policy.get_int("sinks"), 4);
  EXPECT_EQ(report.configs[5].policy.get_int("sinks"), 1);
  EXPECT_EQ(report.configs[5].policy.name, "streaming");
  const nlohmann::json j = fidelity_json(report, "tiny", options, 2, 1.5);
  EXPECT_EQ(j["configs"].size(), 7u);
  EXPECT_EQ(j["configs"][0]["top1_agreement"], 1.0);
  EXPECT_EQ(j["configs"][3]["policy"], "streaming");
  EXPECT_EQ(j["configs"][5]["policy"], "streaming(sinks=1)");
  EXPECT_EQ(j["configs"][5]["params"]["sinks"], 1);
  EXPECT_EQ(j["configs"][2]["mean_kv_bytes"], tight.mean_kv_bytes);
  EXPECT_EQ(j["configs"][2]["peak_slots_per_head"], tight.peak_slots_per_head);
  EXPECT_TRUE(j.contains("param_rule"));
}

TEST_F(BatchRunnerTest, AccuracyReportsEveryConfiguration) {
  BatchRunner r = runner(4);
  const std::vector<Problem> problems = {{"a", "q", "7"}, {"b", "q", "8"}, {"c", "q", "9"}};
  AccuracyOptions options;
  options.dataset = Dataset::kGsm8k;
  options.policies = {"lazy", "tova", "lazy(window=2)"};
  options.budgets = {0.5, 0.7};
  options.max_tokens = 12;
  const AccuracyReport report = run_accuracy(r, problems, {prompt(0), prompt(1), prompt(2)}, options);
  ASSERT_EQ(report.rows.size(), 7u);
  EXPECT_EQ(report.rows[0].policy, "full");
  EXPECT_EQ(report.rows[3].policy, "tova");
  EXPECT_EQ(report.rows[3].budget_ratio, 0.5);
  EXPECT_EQ(report.rows[6].policy, "lazy(window=2)");  // a variant is its own row
  for (const AccuracyRow& row : report.rows) {
    EXPECT_EQ(row.n, 3);
    EXPECT_GT(row.mean_generated_tokens, 0);
    EXPECT_GT(row.max_peak_kv_bytes, 0);
  }
  EXPECT_EQ(report.records.size(), 21u);
  // Budgets follow each problem's full length: max(8, round(0.5 * total)).
  for (const AccuracyRecord& rec : report.records) {
    if (rec.policy != "lazy" || rec.budget_ratio != 0.5) continue;
    const AccuracyRecord& full = report.records[rec.problem];
    const int64_t total = int64_t(prompt(int(rec.problem)).size()) + full.generated_tokens;
    EXPECT_EQ(rec.budget_slots, std::max<int64_t>(8, std::llround(0.5 * double(total))));
  }
}

// The prompt kept on top of a ratio of the answer, policies matched at
// equal mean KV: each record's budget is the matched one, its measured mean
// KV is the model's, and the rows count where answers stopped.
TEST_F(BatchRunnerTest, AccuracyAtEqualMeanKvWithThePromptKept) {
  BatchRunner r = runner(4);
  const std::vector<Problem> problems = {{"a", "q", "7"}, {"b", "q", "8"}};
  const std::vector<std::vector<int32_t>> prompts = {prompt(0), prompt(1)};
  AccuracyOptions options;
  options.policies = {"lazy", "h2o", "tova"};
  options.budgets = {0.5};
  options.max_tokens = 60;
  options.budget_base = BudgetBase::kGenerated;
  options.match = BudgetMatch::kMean;
  options.loop_window = 16;
  const AccuracyReport report = run_accuracy(r, problems, prompts, options);
  ASSERT_EQ(report.rows.size(), 4u);
  const int64_t slot_bytes = int64_t(model_->config().n_layer) * model_->config().n_head_kv * model_->config().head_dim * 4;
  int modelled = 0;
  const int64_t heads = int64_t(model_->config().n_layer) * model_->config().n_head_kv;
  for (const AccuracyRecord& rec : report.records) {
    ASSERT_EQ(rec.error, "") << rec.policy;
    EXPECT_GT(rec.mean_kv_bytes, 0) << rec.policy;
    EXPECT_LE(rec.mean_kv_bytes, double(rec.peak_kv_bytes)) << rec.policy;
    EXPECT_EQ(rec.peak_slots_per_head * heads * model_->config().head_dim * 4, rec.peak_kv_bytes) << rec.policy;
    EXPECT_DOUBLE_EQ(rec.mean_slots_per_head * double(heads * model_->config().head_dim * 4), rec.mean_kv_bytes)
        << rec.policy;
    if (rec.policy == "full") continue;
    const int32_t P = int32_t(prompts[rec.problem].size());
    const AccuracyRecord& full = report.records[rec.problem];
    const PolicyConfig c = problem_policy_config(rec.policy, 0.5, BudgetBase::kGenerated, BudgetMatch::kMean, P,
                                                 full.generated_tokens);
    EXPECT_EQ(rec.budget_slots, c.budget()) << rec.policy;
    EXPECT_EQ(c.get_int("keep_prompt"), 1) << rec.policy;
    // An answer as long as the full one attends exactly the modelled slots.
    if (rec.generated_tokens == full.generated_tokens) {
      ++modelled;
      const KvOccupancy o = kv_occupancy(c, P, int32_t(rec.generated_tokens));
      EXPECT_DOUBLE_EQ(rec.mean_kv_bytes, o.mean * double(slot_bytes)) << rec.policy;
      EXPECT_EQ(rec.peak_slots_per_head, o.peak) << rec.policy;
      EXPECT_LE(o.mean, double(P + budget_slots(0.5, full.generated_tokens))) << rec.policy;
    }
  }
  EXPECT_GT(modelled, 0);
  for (const AccuracyRow& row : report.rows) {
    int64_t at_length = 0, loops = 0;
    for (const AccuracyRecord& rec : report.records) {
      if (rec.policy != row.policy) continue;
      at_length += rec.finish == "length";
      loops += rec.finish == "loop";
    }
    EXPECT_EQ(row.at_length, at_length) << row.policy;
    EXPECT_EQ(row.loops, loops) << row.policy;
    EXPECT_GT(row.mean_kv_bytes, 0) << row.policy;
  }
  const nlohmann::json j = accuracy_json(report, "tiny", options, problems.size(), 1.0);
  EXPECT_EQ(j["budget_base"], "generated");
  EXPECT_EQ(j["match"], "mean");
  EXPECT_EQ(j["loop_window"], 16);
  EXPECT_TRUE(j["results"][1].contains("mean_kv_bytes"));
}

// lazy+tiers in the accuracy harness (in-process tiers): every record keeps
// what it moved, the row sums them, and the JSON reports bytes per token.
TEST_F(BatchRunnerTest, AccuracyReportsWhatLazyTiersMoved) {
  BatchRunner r = runner(4);
  const std::vector<Problem> problems = {{"a", "q", "7"}, {"b", "q", "8"}, {"c", "q", "9"}};
  AccuracyOptions options;
  options.policies = {"lazy+tiers", "lazy"};
  options.budgets = {0.3};
  options.max_tokens = 80;
  const AccuracyReport report = run_accuracy(r, problems, {prompt(0), prompt(1), prompt(2)}, options);
  ASSERT_EQ(report.rows.size(), 3u);
  const AccuracyRow& tiered = report.rows[1];
  ASSERT_EQ(tiered.policy, "lazy+tiers");
  TierCounters sum;
  int64_t generated = 0;
  for (const AccuracyRecord& rec : report.records) {
    if (rec.policy != "lazy+tiers") {
      EXPECT_EQ(rec.tiers.demoted_slots, 0) << rec.policy;
      continue;
    }
    sum += rec.tiers;
    generated += rec.generated_tokens;
    // The record line carries the counters.
    const nlohmann::json line = accuracy_record_json(rec, problems);
    ASSERT_TRUE(line.contains("tiers"));
    EXPECT_EQ(line["tiers"]["demoted_slots"], rec.tiers.demoted_slots);
    EXPECT_EQ(line["tiers"]["promotion_hits"], rec.tiers.promotion_hits);
  }
  // ... and they read back the same from a records file.
  TempDir dir("eval_tiers");
  const std::string path = dir.file("records.jsonl");
  const nlohmann::json header = accuracy_records_header("tiny", "/nonexistent/tiny.gguf", options, "f32");
  {
    AccuracyRecordLog log(path, header, false, problems);
    for (const AccuracyRecord& rec : report.records) log.append(rec);
  }
  const AccuracyRecordLog resumed(path, header, true, problems);
  ASSERT_EQ(resumed.resumed().size(), report.records.size());
  for (size_t i = 0; i < report.records.size(); ++i) {
    const TierCounters& a = report.records[i].tiers;
    const TierCounters& b = resumed.resumed()[i].tiers;
    EXPECT_EQ(std::tie(a.demoted_slots, a.demoted_bytes, a.promoted_slots, a.promoted_bytes, a.promotion_hits,
                       a.fetched_blocks, a.fetched_bytes, a.fetch_waits, a.tiers_available),
              std::tie(b.demoted_slots, b.demoted_bytes, b.promoted_slots, b.promoted_bytes, b.promotion_hits,
                       b.fetched_blocks, b.fetched_bytes, b.fetch_waits, b.tiers_available))
        << report.records[i].policy;
  }
  EXPECT_TRUE(sum.tiers_available);
  EXPECT_GT(sum.demoted_slots, 0) << "nothing was demoted";
  EXPECT_EQ(tiered.tiers.demoted_slots, sum.demoted_slots);
  EXPECT_EQ(tiered.tiers.fetched_bytes, sum.fetched_bytes);
  EXPECT_EQ(tiered.generated, generated);
  const nlohmann::json j = accuracy_json(report, "tiny", options, problems.size(), 1.0);
  EXPECT_FALSE(j["results"][2].contains("tiers"));  // lazy
  const nlohmann::json& t = j["results"][1]["tiers"];
  EXPECT_EQ(t["bytes_demoted"], sum.demoted_bytes);
  EXPECT_DOUBLE_EQ(t["bytes_moved_per_token"].get<double>(),
                   double(sum.demoted_bytes + sum.fetched_bytes) / double(generated));
}

TEST_F(BatchRunnerTest, AccuracyResumesFromEarlierRecords) {
  const std::vector<Problem> problems = {{"a", "q", "7"}, {"b", "q", "8"}, {"c", "q", "9"}};
  const std::vector<std::vector<int32_t>> prompts = {prompt(0), prompt(1), prompt(2)};
  AccuracyOptions options;
  options.policies = {"lazy", "h2o"};
  options.budgets = {0.5, 0.7};
  options.max_tokens = 12;

  // A whole run, keeping every record as its job ends.
  std::vector<AccuracyRecord> all;
  AccuracyResume sink;
  sink.on_record = [&](const AccuracyRecord& r) { all.push_back(r); };
  BatchRunner first = runner(4);
  const AccuracyReport whole = run_accuracy(first, problems, prompts, options, {}, sink);
  ASSERT_EQ(all.size(), 15u);

  // Stopped after problem 0 (every configuration), problem 1's full run and
  // one of problem 2's configurations (one whose full run is not kept, so
  // full runs again but the record is reused).
  AccuracyResume resume;
  for (const AccuracyRecord& r : all) {
    if (r.problem == 0 || (r.problem == 1 && r.policy == "full") ||
        (r.problem == 2 && r.policy == "h2o" && r.budget_ratio == 0.7)) {
      resume.done.push_back(r);
    }
  }
  ASSERT_EQ(resume.done.size(), 7u);
  std::vector<AccuracyRecord> fresh;
  resume.on_record = [&](const AccuracyRecord& r) { fresh.push_back(r); };
  BatchRunner second = runner(4);
  const AccuracyReport resumed = run_accuracy(second, problems, prompts, options, {}, resume);
  ASSERT_EQ(fresh.size(), 8u);  // only what was missing ran
  for (const AccuracyRecord& r : fresh) {
    EXPECT_NE(r.problem, 0u);
    EXPECT_FALSE(r.problem == 1 && r.policy == "full");
    EXPECT_FALSE(r.problem == 2 && r.policy == "h2o" && r.budget_ratio == 0.7);
  }
  // Greedy decoding repeats itself: the report is the same as the whole run's.
  ASSERT_EQ(resumed.rows.size(), whole.rows.size());
  for (size_t i = 0; i < whole.rows.size(); ++i) {
    EXPECT_EQ(resumed.rows[i].policy, whole.rows[i].policy);
    EXPECT_EQ(resumed.rows[i].budget_ratio, whole.rows[i].budget_ratio);
    EXPECT_EQ(resumed.rows[i].n, 3);
    EXPECT_EQ(resumed.rows[i].correct, whole.rows[i].correct);
    EXPECT_EQ(resumed.rows[i].mean_generated_tokens, whole.rows[i].mean_generated_tokens);
    EXPECT_EQ(resumed.rows[i].max_peak_kv_bytes, whole.rows[i].max_peak_kv_bytes);
  }
  ASSERT_EQ(resumed.records.size(), whole.records.size());
  for (size_t i = 0; i < whole.records.size(); ++i) {
    EXPECT_EQ(resumed.records[i].budget_slots, whole.records[i].budget_slots);
    EXPECT_EQ(resumed.records[i].generated_tokens, whole.records[i].generated_tokens);
  }
}

TEST(PolicyGridTest, BudgetsAndWindowRule) {
  EXPECT_EQ(budget_slots(0.5, 100), 50);
  EXPECT_EQ(budget_slots(0.01, 100), 8);
  EXPECT_EQ(budget_slots(300, 100), 300);
  EXPECT_EQ(grid_policy_config("lazy", 1000).get_int("window"), 128);  // the default fits
  EXPECT_EQ(grid_policy_config("lazy", 100).get_int("window"), 25);
  EXPECT_EQ(grid_policy_config("snapkv", 20).get_int("window"), 5);
  EXPECT_EQ(grid_policy_config("lazy", 400).get_int("window"), 100);  // a quarter of the budget, below the default
  EXPECT_EQ(grid_policy_config("rkv", 20).get_int("window"), 5);
  EXPECT_EQ(grid_policy_config("rkv", 200).get_int("window"), 8);
  EXPECT_EQ(grid_policy_config("streaming", 3).get_int("sinks"), 1);
  EXPECT_EQ(grid_policy_config("h2o", 10).get_int("recent"), 0);
  EXPECT_EQ(grid_policy_config("tova", 10).budget(), 10);
  EXPECT_EQ(grid_policy_config("caote", 1000).get_int("recent"), 32);  // the default fits
  EXPECT_EQ(grid_policy_config("caote", 40).get_int("recent"), 10);
  EXPECT_EQ(grid_policy_config("obcache", 40).get_int("recent"), 10);
  EXPECT_EQ(grid_policy_config("obcache", 40).get_int("accumulate"), 1);
  EXPECT_EQ(parse_policies("all").size(), policy_catalog().size() - 2);  // every policy but full and epicache
  EXPECT_THROW(parse_policies("lazy,bogus"), std::exception);
  EXPECT_EQ(parse_budgets("0.1, 0.5,64"), (std::vector<double>{0.1, 0.5, 64}));
  EXPECT_THROW(parse_budgets("0"), std::exception);
  EXPECT_THROW(parse_budgets("abc"), std::exception);
}

// --budget-base generated: the prompt is kept, on top of a ratio of the
// answer; the window rule divides what the prompt leaves.
TEST(PolicyGridTest, AGeneratedBaseKeepsThePrompt) {
  const PolicyConfig lazy = problem_policy_config("lazy", 0.25, BudgetBase::kGenerated, BudgetMatch::kBudget, 100, 800);
  EXPECT_EQ(lazy.budget(), 300);
  EXPECT_EQ(lazy.get_int("keep_prompt"), 1);
  EXPECT_EQ(lazy.get_int("window"), 50);  // a quarter of the 200 generated slots
  EXPECT_EQ(prompt_refusal(lazy, 100), "");
  const PolicyConfig h2o = problem_policy_config("h2o", 0.25, BudgetBase::kGenerated, BudgetMatch::kBudget, 100, 800);
  EXPECT_EQ(h2o.get_int("recent"), 100);  // half of what the prompt leaves, not half of 300
  EXPECT_EQ(problem_policy_config("h2o(recent=0)", 0.25, BudgetBase::kGenerated, BudgetMatch::kBudget, 100, 800)
                .get_int("recent"),
            100);  // 0 means half, of what the prompt leaves
  EXPECT_EQ(problem_policy_config("lazy", 40, BudgetBase::kGenerated, BudgetMatch::kBudget, 100, 800).budget(),
            140);  // an absolute budget: slots on top of the prompt
  EXPECT_EQ(problem_policy_config("raas", 0.25, BudgetBase::kGenerated, BudgetMatch::kBudget, 100, 800).budget(), 300);
  EXPECT_EQ(problem_policy_config("lazy(keep_prompt=0)", 0.25, BudgetBase::kGenerated, BudgetMatch::kBudget, 100, 800)
                .get_int("keep_prompt"),
            0);  // the spec's own value stands
  // The total base is the rule as before: a ratio of prompt + answer.
  const PolicyConfig total = problem_policy_config("lazy", 0.25, BudgetBase::kTotal, BudgetMatch::kBudget, 100, 800);
  EXPECT_EQ(total.budget(), 225);
  EXPECT_EQ(total.get_int("keep_prompt"), 0);
  EXPECT_EQ(total.get_int("window"), 56);
  EXPECT_EQ(parse_budget_base("generated"), BudgetBase::kGenerated);
  EXPECT_THROW(parse_budget_base("prompt"), std::exception);
  EXPECT_EQ(parse_budget_match("peak"), BudgetMatch::kPeak);
  EXPECT_THROW(parse_budget_match("avg"), std::exception);
}

// --match mean / peak: each policy gets the largest budget whose modelled
// mean (peak) slots stay within the target (checked against every larger
// budget, since the occupancy does not always grow with C: vase's window
// follows C), so lazy (peak C + W) gets a smaller C than h2o (peak C + 1)
// at equal peak.
TEST(PolicyGridTest, MatchingChoosesTheLargestBudgetWithinTheTarget) {
  struct Case {
    int32_t P;
    int64_t G;
    double ratio;
  };
  for (const Case& k : {Case{100, 900, 0.3}, Case{1000, 800, 0.15}, Case{50, 300, 0.5}}) {
    for (const BudgetBase base : {BudgetBase::kTotal, BudgetBase::kGenerated}) {
      const int32_t kept = base == BudgetBase::kGenerated ? k.P : 0;
      const int64_t target = kept ? k.P + budget_slots(k.ratio, k.G) : budget_slots(k.ratio, k.P + k.G);
      for (const BudgetMatch match : {BudgetMatch::kMean, BudgetMatch::kPeak}) {
        for (const std::string spec : {"lazy", "h2o", "snapkv", "vase", "raas", "streaming"}) {
          const auto accepted = [&](int64_t c) {
            return prompt_refusal(grid_policy_config(spec, int32_t(c), kept), k.P).empty();
          };
          const auto fits = [&](int64_t c) {
            if (!accepted(c)) return false;
            const KvOccupancy o = kv_occupancy(grid_policy_config(spec, int32_t(c), kept), k.P, int32_t(k.G));
            return (match == BudgetMatch::kMean ? o.mean : double(o.peak)) <= double(target);
          };
          int64_t largest = 0;
          for (int64_t c = k.P + k.G + 1; c >= 2 && largest == 0; --c) largest = fits(c) ? c : 0;
          if (largest == 0) {  // nothing fits (raas keeps a prompt longer than the target): the smallest accepted
            largest = 2;
            while (!accepted(largest)) ++largest;
          }
          const std::string what = spec + " " + budget_base_name(base) + " " + budget_match_name(match) +
                                   " P=" + std::to_string(k.P);
          EXPECT_EQ(problem_policy_config(spec, k.ratio, base, match, k.P, k.G).budget(), largest) << what;
        }
      }
    }
  }
  // At equal peak lazy's window is paid out of its budget.
  const int32_t lazy_c = problem_policy_config("lazy", 0.3, BudgetBase::kTotal, BudgetMatch::kPeak, 100, 900).budget();
  const int32_t h2o_c = problem_policy_config("h2o", 0.3, BudgetBase::kTotal, BudgetMatch::kPeak, 100, 900).budget();
  EXPECT_EQ(h2o_c, 299);
  EXPECT_EQ(lazy_c + grid_policy_config("lazy", lazy_c).get_int("window"), 300);
  // full is never matched: it has no budget.
  EXPECT_EQ(problem_policy_config("full", 0.3, BudgetBase::kTotal, BudgetMatch::kMean, 100, 900).name, "full");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(PolicyGridTest, SpecsSetParametersTheRuleWouldChoose) {
  // Given values win over the window rule; the rest still follows it.
  const PolicyConfig h2o = grid_policy_config("h2o(recent=32)", 205);
  EXPECT_EQ(h2o.get_int("recent"), 32);
  EXPECT_EQ(h2o.budget(), 205);
  const PolicyConfig ob = grid_policy_config("obcache( accumulate = 0 )", 40);
  EXPECT_EQ(ob.get_int("accumulate"), 0);
  EXPECT_EQ(ob.get_int("recent"), 10);
  EXPECT_EQ(grid_policy_config("lazy(alpha=0.001,window=16)", 100).get("alpha"), 0.001);
  EXPECT_EQ(grid_policy_config("h2o (recent=32)", 205).get_int("recent"), 32);  // spaces before '('
  // A given window that does not fit a small budget is cut as the defaults are.
  EXPECT_EQ(grid_policy_config("obcache(recent=64)", 40).get_int("recent"), 10);
  EXPECT_EQ(grid_policy_config("lazy(window=16)", 16).get_int("window"), 4);
  EXPECT_EQ(split_list("lazy, h2o(recent=32,x=1) ,tova,"), (std::vector<std::string>{"lazy", "h2o(recent=32,x=1)", "tova"}));
  EXPECT_EQ(parse_policies("h2o(recent=32),obcache(accumulate=0),h2o"),
            (std::vector<std::string>{"h2o(recent=32)", "obcache(accumulate=0)", "h2o"}));
}

TEST(PolicyGridTest, BadSpecsSayWhatIsWrong) {
  EXPECT_NE(error_of([] { parse_policies("h2o(budget=64)"); }).find("the budget comes from --budgets"), std::string::npos);
  EXPECT_NE(error_of([] { parse_policies("h2o(recent)"); }).find("'recent' is not param=value"), std::string::npos);
  // epicache only where conversations are (eval conversation).
  EXPECT_NE(error_of([] { parse_policies("lazy,epicache"); }).find("eval conversation"), std::string::npos);
  EXPECT_EQ(parse_policies("lazy,epicache(block=64)", true).size(), 2u);
  EXPECT_NE(error_of([] { parse_policies("h2o(recent=1,recent=2)"); }).find("given twice"), std::string::npos);
  EXPECT_NE(error_of([] { parse_policies("h2o(recent=1"); }).find("expected name(param=value,...)"), std::string::npos);
  EXPECT_NE(error_of([] { parse_policies("h2o(window=8)"); }).find("no parameter 'window'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_policies("obcache(accumulate=3)"); }).find("accumulate"), std::string::npos);
  EXPECT_NE(error_of([] { parse_policies("bogus(x=1)"); }).find("valid policies"), std::string::npos);
  EXPECT_NE(error_of([] { parse_policies("h2o()"); }).find("no parameters between the parentheses (write 'h2o')"),
            std::string::npos);
}

}  // namespace
}  // namespace lazykv::eval
