// Prompt KV reuse in the in-process worker (LocalWorkerOptions::
// prefix_cache_bytes) on a tiny random model: a prompt that starts like an
// earlier one takes its whole pages and computes only the rest, with the
// same tokens as a worker that computes it all; eviction in one sequence
// never changes another's shared prefix; policies that need the prompt's
// queries compute them; a full cache gives the prefix pages back first.
#include <gtest/gtest.h>

#include <vector>

#include "tests/unit/step_plans.h"
#include "tests/unit/tiny_model_fixture.h"
#include "worker/local_worker.h"
#include "worker/tiers/tier_mover.h"

namespace lazykv {
namespace {

class PromptReuseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_tiny_model("prompt_reuse_test").model.release(); }
  static void TearDownTestSuite() { delete model_; }

  static LocalWorkerOptions options(size_t prefix_cache_bytes, size_t capacity = 0) {
    LocalWorkerOptions o;
    o.threads = 2;
    o.kv_capacity_bytes = capacity;
    o.prefix_cache_bytes = prefix_cache_bytes;
    return o;
  }

  // Prompt tokens i = 0..n-1 of a prompt numbered `variant`: prompts of two
  // variants differ from their first token on.
  static std::vector<int32_t> prompt(int n, int variant = 0) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(3 + (7 * i + 31 * variant) % 250);
    return p;
  }

  struct Run {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    int32_t cached = 0;  // cached_tokens reported
    int32_t fed = 0;     // prompt tokens the worker's passes fed
    size_t fetched_bytes = 0;  // prefix_fetched_bytes reported
  };

  // Starts `seq` and runs it greedily: prefill items of `chunk` tokens until
  // one samples, then `decode` decode steps.
  static Run generate(LocalWorker& worker, SeqId seq, const std::vector<int32_t>& tokens, int32_t chunk, int decode,
                      PolicyConfig policy = make_policy_config("full")) {
    StepPlan plan;
    SequenceStart start;
    start.seq = seq;
    start.prompt = tokens;
    start.policy = std::move(policy);
    start.top_logprobs = 0;
    start.chunks_carry_mask = true;
    plan.start = {start};
    Run run;
    const auto step = [&](int32_t prefill) {
      plan.items = {{seq, prefill, {}}};
      const StepResult r = worker.step(plan);
      plan.start.clear();
      EXPECT_TRUE(r.failed.empty()) << (r.failed.empty() ? "" : r.failed[0].second);
      EXPECT_FALSE(r.out_of_memory);
      run.fetched_bytes += r.prefix_fetched_bytes;
      if (r.tokens.size() != 1) return false;
      run.cached += r.tokens[0].cached_tokens;
      if (prefill > 0) run.fed += r.batch_tokens;
      if (r.tokens[0].token < 0) return true;
      run.tokens.push_back(r.tokens[0].token);
      run.logprobs.push_back(r.tokens[0].logprob);
      return true;
    };
    while (run.tokens.empty()) {
      if (!step(chunk)) return run;
    }
    for (int i = 0; i < decode; ++i) {
      if (!step(0)) return run;
    }
    return run;
  }

  static StepResult release(LocalWorker& worker, SeqId seq) {
    StepPlan plan;
    plan.release = {seq};
    return worker.step(plan);
  }

  static constexpr size_t kPrefixBytes = size_t(64) << 20;
  static Model* model_;
};

Model* PromptReuseTest::model_ = nullptr;

TEST_F(PromptReuseTest, APromptThatStartsLikeAnEarlierOneComputesOnlyTheRest) {
  LocalWorker worker(*model_, options(kPrefixBytes));
  const Run first = generate(worker, 1, prompt(150), 512, 4);
  EXPECT_EQ(first.cached, 0);
  EXPECT_EQ(first.fed, 150);
  const StepResult released = release(worker, 1);
  const size_t page_set = size_t(worker.info().n_layer * worker.info().n_head_kv) * worker.info().kv_page_bytes;
  // Its 153 tokens' pages stay (two whole, one of 25), unshared: no
  // sequence's memory, the prefix cache's.
  EXPECT_EQ(released.prefix_cache_bytes, 3 * page_set);
  EXPECT_EQ(released.kv_bytes, 0u);

  // 150 tokens in common: two whole pages and 22 tokens of the third are
  // taken, 40 computed.
  std::vector<int32_t> second = prompt(150);
  for (int32_t t : prompt(40, 1)) second.push_back(t);
  const Run reused = generate(worker, 2, second, 512, 20);
  EXPECT_EQ(reused.cached, 150);
  EXPECT_EQ(reused.fed, 190 - 150);

  // The same tokens as a worker that computes the whole prompt in one pass.
  LocalWorker plain(*model_, options(0));
  const Run computed = generate(plain, 2, second, 512, 20);
  EXPECT_EQ(computed.cached, 0);
  EXPECT_EQ(computed.fed, 190);
  EXPECT_EQ(reused.tokens, computed.tokens);
  ASSERT_EQ(reused.logprobs.size(), computed.logprobs.size());
  for (size_t i = 0; i < reused.logprobs.size(); ++i) EXPECT_NEAR(reused.logprobs[i], computed.logprobs[i], 1e-5);

  // A prompt with another start shares nothing.
  const Run other = generate(worker, 3, prompt(150, 2), 512, 1);
  EXPECT_EQ(other.cached, 0);
  // A coordinator that sends grammar masks with the last chunk only gets none.
  StepPlan older = plan_starting(4, second);
  const StepResult r = worker.step(older);
  ASSERT_EQ(r.tokens.size(), 1u);
  EXPECT_EQ(r.tokens[0].cached_tokens, 0);
  EXPECT_EQ(r.batch_tokens, 190);
  // A few tokens in common with a stored block are not worth a page copy:
  // 128 + 10 take the two whole pages only.
  std::vector<int32_t> few = prompt(138);
  for (int32_t t : prompt(40, 3)) few.push_back(t);
  EXPECT_EQ(generate(worker, 5, few, 512, 0).cached, 128);
}

TEST_F(PromptReuseTest, EvictionInOneSequenceNeverChangesAnothersSharedPrefix) {
  LocalWorker worker(*model_, options(kPrefixBytes));
  generate(worker, 1, prompt(150), 512, 1);
  // Sequence 2 shares the prefix and evicts from it at the prompt's end (a
  // budget of 24 slots): the shared pages are copied before it compacts
  // them. It evicts what one pass over its whole prompt would have left it.
  const PolicyConfig streaming = make_policy_config("streaming", {{"budget", "24"}, {"sinks", "4"}});
  const Run evicting = generate(worker, 2, prompt(160), 512, 10, streaming);
  EXPECT_EQ(evicting.cached, 128);  // the whole pages of sequence 1's prompt (it still runs)
  LocalWorker plain(*model_, options(0));
  EXPECT_EQ(evicting.tokens, generate(plain, 2, prompt(160), 512, 10, streaming).tokens);
  // Sequence 3, after that, reads the prefix as it was computed.
  const Run after = generate(worker, 3, prompt(170), 512, 10);
  EXPECT_EQ(after.cached, 128);
  EXPECT_EQ(after.tokens, generate(plain, 3, prompt(170), 512, 10).tokens);
}

// A finished sequence leaves its generated tokens' pages too (a chat's next
// turn starts with the reply), unless its policy evicted: the tokens after an
// eviction were computed without what it dropped.
TEST_F(PromptReuseTest, AReleasedSequenceLeavesItsRepliesPagesWhenNothingWasEvicted) {
  LocalWorker worker(*model_, options(kPrefixBytes));
  const std::vector<int32_t> first_prompt = prompt(100);
  const Run first = generate(worker, 1, first_prompt, 512, 50);
  release(worker, 1);
  std::vector<int32_t> next_turn = first_prompt;
  next_turn.insert(next_turn.end(), first.tokens.begin(), first.tokens.end() - 1);  // the 50 it fed
  for (int32_t t : prompt(30, 1)) next_turn.push_back(t);
  const Run second = generate(worker, 2, next_turn, 512, 5);
  EXPECT_EQ(second.cached, 150);  // the prompt's 100 and the 50 of the reply
  LocalWorker plain(*model_, options(0));
  EXPECT_EQ(second.tokens, generate(plain, 2, next_turn, 512, 5).tokens);

  LocalWorker evicting(*model_, options(kPrefixBytes));
  generate(evicting, 1, first_prompt, 512, 50, make_policy_config("streaming", {{"budget", "24"}, {"sinks", "4"}}));
  release(evicting, 1);
  EXPECT_EQ(generate(evicting, 2, next_turn, 512, 0).cached, 64);  // the prompt's page, kept before it evicted
}

// Every policy, after a shared prefix (evicting from it included), gives the
// tokens it gives without the cache.
TEST_F(PromptReuseTest, EveryPolicyGivesTheSameTokensWithAndWithoutTheCache) {
  std::vector<int32_t> shared_then_own = prompt(150);
  for (int32_t t : prompt(40, 1)) shared_then_own.push_back(t);
  const std::vector<PolicyConfig> policies = {
      make_policy_config("full"),
      make_policy_config("lazy", {{"budget", "100"}, {"window", "16"}}),
      make_policy_config("lazy+tiers", {{"budget", "100"}, {"window", "16"}}),
      make_policy_config("streaming", {{"budget", "24"}, {"sinks", "4"}}),
      make_policy_config("h2o", {{"budget", "100"}}),
      make_policy_config("tova", {{"budget", "100"}}),
      make_policy_config("snapkv", {{"budget", "100"}, {"window", "16"}}),
      make_policy_config("rkv", {{"budget", "100"}}),
      make_policy_config("raas", {{"budget", "100"}}),
      make_policy_config("caote", {{"budget", "100"}}),
      make_policy_config("obcache", {{"budget", "100"}}),
      make_policy_config("vase", {{"budget", "100"}, {"window", "32"}}),
      make_policy_config("laq", {{"budget", "100"}}),
  };
  for (const PolicyConfig& policy : policies) {
    LocalWorker worker(*model_, options(kPrefixBytes));
    generate(worker, 1, prompt(150), 512, 3);
    release(worker, 1);
    const Run reused = generate(worker, 2, shared_then_own, 512, 20, policy);
    LocalWorker plain(*model_, options(0));
    const Run computed = generate(plain, 2, shared_then_own, 512, 20, policy);
    EXPECT_EQ(reused.tokens, computed.tokens) << policy.to_string();
    EXPECT_EQ(reused.tokens.size(), 21u) << policy.to_string();
    EXPECT_EQ(reused.cached, policy.name == "h2o" ? 0 : 150) << policy.to_string();
  }
}

TEST_F(PromptReuseTest, PoliciesThatNeedThePromptsQueriesComputeThem) {
  LocalWorker worker(*model_, options(kPrefixBytes));
  generate(worker, 1, prompt(200), 512, 0);
  // H2O sums every prompt query's attention: nothing is taken.
  EXPECT_EQ(generate(worker, 2, prompt(200), 512, 0, make_policy_config("h2o", {{"budget", "64"}})).cached, 0);
  // SnapKV's window of 100 queries must be computed: 200 - 100 are taken.
  EXPECT_EQ(generate(worker, 3, prompt(200), 512, 0,
                     make_policy_config("snapkv", {{"budget", "128"}, {"window", "100"}})).cached,
            100);
  // TOVA needs only the last query's: the three whole pages (the running
  // prompt's last page is not stored: it is still written), as for `full`.
  EXPECT_EQ(generate(worker, 4, prompt(200), 512, 0, make_policy_config("tova", {{"budget", "64"}})).cached, 192);
  EXPECT_EQ(generate(worker, 5, prompt(200), 512, 0).cached, 192);
  // The last token is always computed (it samples).
  EXPECT_EQ(generate(worker, 6, prompt(192), 512, 0).cached, 191);
}

TEST_F(PromptReuseTest, AFullCacheGivesThePrefixPagesBackBeforeRefusingAPass) {
  LocalWorker probe(*model_, options(0));
  const size_t page_set = size_t(probe.info().n_layer * probe.info().n_head_kv) * probe.info().kv_page_bytes;
  // Room for four page sets: a released 200-token prompt leaves all four in the prefix cache.
  LocalWorker worker(*model_, options(kPrefixBytes, 4 * page_set));
  generate(worker, 1, prompt(200), 512, 0);
  const StepResult released = release(worker, 1);
  EXPECT_EQ(released.prefix_cache_bytes, 4 * page_set);
  EXPECT_EQ(released.kv_bytes, 0u);
  // Another prompt of three pages (four with its decode tokens) needs the
  // room: the stored pages go, and its own take their place.
  const Run other = generate(worker, 2, prompt(190, 1), 512, 3);
  EXPECT_EQ(other.tokens.size(), 4u);
  EXPECT_EQ(release(worker, 2).prefix_cache_bytes, 4 * page_set);
}

TEST_F(PromptReuseTest, TheCacheHoldsNoMoreThanItsBytes) {
  LocalWorker probe(*model_, options(0));
  const size_t page_set = size_t(probe.info().n_layer * probe.info().n_head_kv) * probe.info().kv_page_bytes;
  LocalWorker worker(*model_, options(2 * page_set));
  generate(worker, 1, prompt(200), 512, 0);
  EXPECT_EQ(release(worker, 1).prefix_cache_bytes, 2 * page_set);
  EXPECT_EQ(generate(worker, 2, prompt(200), 512, 0).cached, 128);
}

// With --prefix-cache-tiers, what one worker computed reaches another (a
// replica, or this one restarted) through the process's tiers: the whole
// blocks of its prompt, fetched instead of computed, with the same tokens.
TEST_F(PromptReuseTest, AnotherWorkerFetchesThePromptsWholeBlocksFromTheTiers) {
  tiers::configure_tiers(tiers::TierConfig{});  // in-process host tier
  struct Shutdown {
    ~Shutdown() { tiers::shutdown_tiers(); }  // also when an assertion ends the test
  } shutdown;
  LocalWorkerOptions with_tiers = options(kPrefixBytes);
  with_tiers.prefix_tiers = true;
  {
    LocalWorker first(*model_, with_tiers);
    generate(first, 1, prompt(150), 512, 4);
    release(first, 1);
  }
  tiers::process_tiers()->flush();
  LocalWorker second(*model_, with_tiers);
  std::vector<int32_t> longer = prompt(150);
  for (int32_t t : prompt(40, 1)) longer.push_back(t);
  const Run fetched = generate(second, 2, longer, 512, 20);
  EXPECT_EQ(fetched.cached, 128);  // two whole blocks; the first worker's tail stayed with it
  EXPECT_EQ(fetched.fed, 190 - 128);
  const size_t page_set = size_t(second.info().n_layer * second.info().n_head_kv) * second.info().kv_page_bytes;
  EXPECT_EQ(fetched.fetched_bytes, 2 * (64 * sizeof(int32_t) + page_set));  // two blocks: token ids and pages
  LocalWorker plain(*model_, options(0));
  const Run computed = generate(plain, 2, longer, 512, 20);
  EXPECT_EQ(fetched.tokens, computed.tokens);
  ASSERT_EQ(fetched.logprobs.size(), computed.logprobs.size());
  for (size_t i = 0; i < computed.logprobs.size(); ++i) EXPECT_FLOAT_EQ(fetched.logprobs[i], computed.logprobs[i]);
}

}  // namespace
}  // namespace lazykv
