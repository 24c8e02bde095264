#include "worker/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "common/error.h"

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
}

}  // namespace
}  // namespace lazykv

namespace lazykv {
namespace {

TEST(Sampler, NonFiniteInputsDoNotBreakSampling) {
  SamplingParams p;
  p.temperature = 1e-38f;  // logits / temperature overflow: greedy
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
