#include "worker/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "common/error.h"
#include "common/sampling_limits.h"

namespace lazykv {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};

TEST(Sampler, GreedyIsArgmaxWithLowestIndexOnTies) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(kLogits), 1);
  EXPECT_EQ(argmax(kLogits), 1);
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 200; ++i) {
    sa.push_back(a.sample(kLogits));
    sb.push_back(b.sample(kLogits));
    sc.push_back(c.sample(kLogits));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  Sampler s(p);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[s.sample(kLogits)]++;
  double z = 0;
  for (float l : kLogits) z += std::exp(l);
  for (size_t i = 0; i < kLogits.size(); ++i) {
    const double expected = std::exp(kLogits[i]) / z;
    EXPECT_NEAR(double(counts[int32_t(i)]) / n, expected, 0.015) << "token " << i;
  }
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 1;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(kLogits), 1);
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;  // tokens 1 and 3 hold ~0.33 each: both are needed, nothing else
  Sampler s(p);
  for (int i = 0; i < 300; ++i) {
    const int32_t t = s.sample(kLogits);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: 1, 3 (token 2 is e^-1 = 0.37)
  Sampler s(p);
  for (int i = 0; i < 300; ++i) {
    const int32_t t = s.sample(kLogits);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, RejectsInvalidParameters) {
  SamplingParams p;
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.min_p = 1.5f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.presence_penalty = 2.5f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.frequency_penalty = -2.5f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p.repetition_penalty = 1e-30f;  // would turn a seen logit into infinity
  EXPECT_THROW(Sampler{p}, Error);
  // The bounds themselves pass, as the API's double narrowed to float.
  p.repetition_penalty = float(0.01);
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.logit_bias = {{3, 100.0f}, {4, -100.0f}};
  EXPECT_NO_THROW(Sampler{p});
  p = {};
  p.logit_bias.assign(sampling_limits::kMaxLogitBiasEntries + 1, {1, 1.0f});
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.logit_bias = {{3, 100.5f}};
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.min_tokens = -1;
  EXPECT_THROW(Sampler{p}, Error);
}

// Greedy picks from kLogits = {1, 3, 2, 3, -1, 0.5} after OpenAI's
// penalties: logit - presence * (count > 0) - frequency * count over the
// tokens generated so far.
TEST(Sampler, PresenceAndFrequencyPenaltiesFollowOpenAisFormula) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.6f;
  Sampler s(p);
  std::vector<int32_t> picks;
  for (int i = 0; i < 5; ++i) picks.push_back(s.sample(kLogits));
  // 1 (3.0) -> 1 drops to 1.9; 3 (3.0) -> 1.9; 2 (2.0) -> 0.9; 1 (1.9, the
  // lower index of a tie) -> 1.3; 3 (1.9).
  EXPECT_EQ(picks, (std::vector<int32_t>{1, 3, 2, 1, 3}));

  const std::vector<float> logits = {2.0f, 2.5f, 0.0f};
  p = {};
  p.frequency_penalty = 0.3f;  // 2.5 - 0.3 k falls below 2.0 once 1 was used twice
  Sampler often(p);
  EXPECT_EQ(often.sample(logits), 1);
  EXPECT_EQ(often.sample(logits), 1);
  EXPECT_EQ(often.sample(logits), 0);
  p.frequency_penalty = 1.0f;
  p.presence_penalty = -2.0f;  // negative: outweighs the frequency penalty, 1 keeps being said
  Sampler repeat(p);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(repeat.sample(logits), 1);  // 2.5 + 2 - k: above 2.0 up to k = 2
}

// Hugging Face's repetition penalty: a token in the prompt or the output has
// a positive logit divided by the penalty and a negative one multiplied.
TEST(Sampler, RepetitionPenaltyCountsThePromptAndDividesOrMultiplies) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  const std::vector<int32_t> prompt = {0, 2};
  s.start(prompt, 0);
  const std::vector<float> logits = {2.0f, 1.9f, -0.4f, -0.5f};
  EXPECT_EQ(s.sample(logits), 1);  // 0: 2.0 / 2 = 1.0
  EXPECT_EQ(s.sample(logits), 0);  // 1: 1.9 / 2 = 0.95 < 1.0
  const std::vector<float> negative = {-1.0f, -1.5f, -0.8f};
  Sampler n(p);
  n.start(prompt, 0);
  EXPECT_EQ(n.sample(negative), 1);  // 0: -1.0 * 2 = -2.0, 2: -0.8 * 2 = -1.6, both below 1's -1.5
}

TEST(Sampler, LogitBiasBansAndForcesTokens) {
  SamplingParams p;
  p.logit_bias = {{1, -100.0f}, {3, -100.0f}};
  EXPECT_EQ(Sampler(p).sample(kLogits), 2);
  p.logit_bias = {{4, 100.0f}};
  EXPECT_EQ(Sampler(p).sample(kLogits), 4);
  p.logit_bias = {{1, -100.0f}, {3, -100.0f}, {99, 5.0f}};  // ids past the logits are left alone
  p.temperature = 1.0f;
  p.seed = 3;
  Sampler sampled(p);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[sampled.sample(kLogits)];
  EXPECT_EQ(counts.count(1), 0u);
  EXPECT_EQ(counts.count(3), 0u);
  EXPECT_GT(counts[2], 1000);  // e^2 / (e^1 + e^2 + e^-1 + e^0.5): 61%
}

TEST(Sampler, MinTokensHoldsEndTokensBackAndCountsEarlierOutput) {
  SamplingParams p;
  p.min_tokens = 2;
  p.end_tokens = {1};
  Sampler s(p);
  EXPECT_EQ(s.sample(kLogits), 3);
  EXPECT_EQ(s.sample(kLogits), 3);
  EXPECT_EQ(s.sample(kLogits), 1);
  // Started again after a preemption with one token already generated.
  Sampler again(p);
  const std::vector<int32_t> fed = {5, 5, 3};
  again.start(fed, 1);
  EXPECT_EQ(again.sample(kLogits), 3);
  EXPECT_EQ(again.sample(kLogits), 1);
}

// A sampled sequence preempted after 25 tokens and started again with them
// as the tail of its prompt draws what the uninterrupted one drew next.
TEST(Sampler, SampledOutputGoesOnAfterAPreemption) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 11;
  Sampler whole(p);
  std::vector<int32_t> fed = {0, 2, 5};  // a prompt
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(whole.sample(kLogits));
  fed.insert(fed.end(), tokens.begin(), tokens.begin() + 25);
  Sampler again(p);
  again.start(fed, 25);
  for (int i = 25; i < 40; ++i) EXPECT_EQ(again.sample(kLogits), tokens[size_t(i)]) << "token " << i;
  Sampler fresh(p);  // counting the 25 as prompt instead restarts the stream
  fresh.start(fed, 0);
  std::vector<int32_t> restarted;
  for (int i = 25; i < 40; ++i) restarted.push_back(fresh.sample(kLogits));
  EXPECT_NE(restarted, std::vector<int32_t>(tokens.begin() + 25, tokens.end()));
}

TEST(Sampler, PenaltiesCountOutputFedBackAfterAPreemptionButNotThePrompt) {
  SamplingParams p;
  p.frequency_penalty = 0.6f;
  Sampler s(p);
  const std::vector<int32_t> fed = {3, 3, 3, 1, 1};  // prompt {3, 3, 3}, then 1 twice
  s.start(fed, 2);
  EXPECT_EQ(s.sample(kLogits), 3);  // 1: 3.0 - 2 * 0.6 = 1.8; 3 is in the prompt only: 3.0
  EXPECT_EQ(s.sample(kLogits), 3);  // 3: 2.4
  EXPECT_EQ(s.sample(kLogits), 2);  // 3: 1.8, 1: 1.8, 2: 2.0
}

}  // namespace
}  // namespace lazykv

namespace lazykv {
namespace {

TEST(Sampler, NonFiniteInputsDoNotBreakSampling) {
  SamplingParams p;
  p.temperature = 1e-39f;  // 3 / 1e-39 overflows (3 / 1e-38 would not): greedy, the lowest of the tied 1 and 3
  Sampler tiny(p);
  EXPECT_EQ(tiny.sample(kLogits), 1);
  p.temperature = 1.0f;
  Sampler s(p);
  const std::vector<float> with_nan = {std::nanf(""), 5.0f, -1.0f};
  for (int i = 0; i < 50; ++i) EXPECT_NE(s.sample(with_nan), 0);
  EXPECT_EQ(argmax(with_nan), 1);
}

}  // namespace
}  // namespace lazykv
