// The CPU eviction kernels on hand-computed inputs.
#include "kernels/cpu/eviction.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace lazykv::cpu {
namespace {

TEST(LazyUpdate, HitsSetMriThenLast) {
  const std::vector<uint8_t> hits = {1, 0, 1, 1};
  std::vector<int32_t> last = {0, 2, 5, 9};
  std::vector<int32_t> mri = {0, 1, 7, 0};
  lazy_update(hits.data(), last.data(), mri.data(), 4, 10);
  EXPECT_EQ(last, (std::vector<int32_t>{10, 2, 10, 10}));
  // mri = max(mri, t - last) with last before the update: 10, (untouched), max(7, 5), max(0, 1).
  EXPECT_EQ(mri, (std::vector<int32_t>{10, 1, 7, 1}));
}

TEST(LazyUpdate, NoHitsChangesNothing) {
  const std::vector<uint8_t> hits = {0, 0};
  std::vector<int32_t> last = {3, 4}, mri = {2, 0};
  lazy_update(hits.data(), last.data(), mri.data(), 2, 7);
  EXPECT_EQ(last, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(mri, (std::vector<int32_t>{2, 0}));
}

float expected_score(int32_t last, int32_t mri, int32_t t) {
  const double first = 2.0 / (1.0 + std::exp(1.0 + double(t - last) / (double(mri) + 1e-5)));
  const double second = mri == 0 ? 0.0 : 2.0 / (1.0 + std::exp(double(mri) - 1.0));
  return float(first + second);
}

TEST(LazyScores, MatchesTheFormula) {
  // (last, mri) at t = 8, values worked by hand:
  //  (8, 4): 2/(1+e^1) + 2/(1+e^3)       = 0.537883 + 0.094851 = 0.632734
  //  (5, 1): 2/(1+e^4) + 2/(1+e^0)       = 0.035972 + 1        = 1.035972
  //  (7, 2): 2/(1+e^1.5) + 2/(1+e^1)     = 0.364851 + 0.537883 = 0.902734
  //  (6, 3): 2/(1+e^(5/3)) + 2/(1+e^2)   = 0.317738 + 0.238406 = 0.556144
  const std::vector<int32_t> last = {8, 5, 7, 6};
  const std::vector<int32_t> mri = {4, 1, 2, 3};
  std::vector<float> out(4);
  lazy_scores(last.data(), mri.data(), 4, 8, out.data());
  const std::vector<float> hand = {0.632734f, 1.035972f, 0.902734f, 0.556144f};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(out[i], hand[i], 2e-6f) << i;
    EXPECT_NEAR(out[i], expected_score(last[i], mri[i], 8), 1e-6f) << i;
  }
}

TEST(LazyScores, NeverHitSlotsScoreZero) {
  // mri == 0: the recurrence term is 0 by the formula's case, and the recency
  // term's exponent (t - last)/1e-5 is huge, so it vanishes too.
  const std::vector<int32_t> last = {0, 6, 9};
  const std::vector<int32_t> mri = {0, 0, 0};
  std::vector<float> out(3, -1.0f);
  lazy_scores(last.data(), mri.data(), 3, 10, out.data());
  for (float v : out) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_EQ(v, 0.0f);
  }
}

TEST(LazyScores, HitThisStepWithMriZeroIsOnlyRecency) {
  // t == last and mri == 0 cannot arise from lazy_update (a hit sets mri >= 1),
  // but the formula still defines it: 2/(1+e^1) + 0.
  const int32_t last = 4, mri = 0;
  float out = 0;
  lazy_scores(&last, &mri, 1, 4, &out);
  EXPECT_NEAR(out, 2.0f / (1.0f + std::exp(1.0f)), 1e-6f);
}

TEST(LazyScores, RecentRecurrenceOutranksOld) {
  const std::vector<int32_t> last = {10, 2};
  const std::vector<int32_t> mri = {3, 3};
  std::vector<float> out(2);
  lazy_scores(last.data(), mri.data(), 2, 10, out.data());
  EXPECT_GT(out[0], out[1]);
}

std::vector<int32_t> top_k(const std::vector<float>& scores, int32_t k) {
  std::vector<int32_t> keep(static_cast<size_t>(k));
  std::vector<int32_t> scratch(scores.size());
  top_k_slots(scores.data(), int32_t(scores.size()), k, keep.data(), scratch.data());
  return keep;
}

TEST(TopKSlots, HighestInIndexOrder) {
  EXPECT_EQ(top_k({0.1f, 0.9f, 0.3f, 0.7f, 0.5f}, 3), (std::vector<int32_t>{1, 3, 4}));
}

TEST(TopKSlots, TiesGoToTheLowerIndex) {
  EXPECT_EQ(top_k({0.5f, 0.2f, 0.5f, 0.5f, 0.1f}, 2), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(top_k({0.0f, 0.0f, 0.0f, 0.0f}, 3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(top_k({0.3f, 1.0f, 0.3f, 0.3f}, 2), (std::vector<int32_t>{0, 1}));
}

TEST(TopKSlots, KZeroAndKEqualsN) {
  EXPECT_TRUE(top_k({0.4f, 0.2f}, 0).empty());
  EXPECT_EQ(top_k({0.4f, 0.2f, 0.9f}, 3), (std::vector<int32_t>{0, 1, 2}));
}

TEST(TopKSlots, NegativeScores) {
  EXPECT_EQ(top_k({-0.5f, -0.1f, -0.9f}, 1), (std::vector<int32_t>{1}));
}

std::vector<float> pool(const std::vector<float>& x, int kernel) {
  std::vector<float> y(x.size(), -1.0f);
  max_pool1d(x.data(), int32_t(x.size()), kernel, y.data());
  return y;
}

TEST(MaxPool1d, WindowCutAtTheEnds) {
  const std::vector<float> x = {5, 1, 2, 0, 3, 0, 0};
  EXPECT_EQ(pool(x, 3), (std::vector<float>{5, 5, 2, 3, 3, 3, 0}));
  EXPECT_EQ(pool(x, 5), (std::vector<float>{5, 5, 5, 3, 3, 3, 3}));
  EXPECT_EQ(pool(x, 1), x);
}

// Zero-padded: a window cut at the ends still divides by the kernel.
TEST(AvgPool1d, ZeroPaddedAtTheEnds) {
  const std::vector<float> x = {6, 3, 0, 9, 3};
  std::vector<float> y(x.size());
  avg_pool1d(x.data(), int32_t(x.size()), 3, y.data());
  EXPECT_EQ(y, (std::vector<float>{3, 3, 4, 4, 4}));
  avg_pool1d(x.data(), int32_t(x.size()), 1, y.data());
  EXPECT_EQ(y, x);
  avg_pool1d(x.data(), int32_t(x.size()), 63, y.data());
  EXPECT_EQ(y, std::vector<float>(x.size(), 21.0f / 63.0f));
}

TEST(MaxPool1d, KernelWiderThanInput) {
  EXPECT_EQ(pool({1, 4, 2}, 63), (std::vector<float>{4, 4, 4}));
  EXPECT_EQ(pool({7}, 5), (std::vector<float>{7}));
}

TEST(MaxPool1d, NegativeValuesNotPaddedWithZero) {
  // Padding never counts: an all-negative input stays negative at the edges.
  EXPECT_EQ(pool({-3, -1, -2}, 3), (std::vector<float>{-1, -1, -1}));
  EXPECT_EQ(pool({-3, -5, -4, -6}, 3), (std::vector<float>{-3, -3, -4, -4}));
}

TEST(CompactSlots, MovesKeptEntriesToTheFront) {
  std::vector<int32_t> a = {10, 11, 12, 13, 14, 15};
  const std::vector<int32_t> keep = {1, 2, 4};
  compact_slots(a.data(), std::span<const int32_t>(keep));
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 3), (std::vector<int32_t>{11, 12, 14}));
}

TEST(CompactSlots, IdentityAndEmpty) {
  std::vector<float> a = {1.5f, 2.5f, 3.5f};
  const std::vector<int32_t> all = {0, 1, 2};
  compact_slots(a.data(), std::span<const int32_t>(all));
  EXPECT_EQ(a, (std::vector<float>{1.5f, 2.5f, 3.5f}));
  compact_slots(a.data(), std::span<const int32_t>());
  EXPECT_EQ(a, (std::vector<float>{1.5f, 2.5f, 3.5f}));
}

TEST(CaoteScores, HandComputed) {
  // o = 0.5 (1, 0) + 0.25 (0, 1) + 0.25 (0, -1) = (0.5, 0).
  const std::vector<float> p = {0.5f, 0.25f, 0.25f, 0.0f};
  const std::vector<float> v = {1, 0, 0, 1, 0, -1, 3, 3};
  std::vector<float> o(2), out(4);
  caote_scores(p.data(), v.data(), 4, 2, o.data(), out.data());
  EXPECT_FLOAT_EQ(o[0], 0.5f);
  EXPECT_FLOAT_EQ(o[1], 0.0f);
  EXPECT_FLOAT_EQ(out[0], 0.5f);                         // 0.5 / 0.5 * |(-0.5, 0)|
  EXPECT_FLOAT_EQ(out[1], std::sqrt(1.25f) / 3.0f);      // 0.25 / 0.75 * |(0.5, -1)|
  EXPECT_FLOAT_EQ(out[2], out[1]);
  EXPECT_EQ(out[3], 0.0f);                               // no attention: no error
}

TEST(CaoteScores, EqualsTheOutputShiftOfEvictingEachSlot) {
  // The definition: drop slot s, renormalise the rest, measure how far the
  // attention output moves.
  const int32_t n = 7;
  const int D = 5;
  std::vector<float> p(n), v(size_t(n) * D), o(D), out(n);
  float total = 0;
  for (int32_t s = 0; s < n; ++s) total += p[size_t(s)] = 1.0f + float((s * 37) % 11);
  for (float& x : p) x /= total;
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7f * float(i)) * 2.0f;
  caote_scores(p.data(), v.data(), n, D, o.data(), out.data());
  for (int32_t s = 0; s < n; ++s) {
    double shift = 0;
    for (int d = 0; d < D; ++d) {
      double without = 0;
      for (int32_t j = 0; j < n; ++j) {
        if (j != s) without += double(p[size_t(j)]) * v[size_t(j) * D + d];
      }
      without /= 1.0 - double(p[size_t(s)]);
      shift += (without - o[size_t(d)]) * (without - o[size_t(d)]);
    }
    EXPECT_NEAR(out[size_t(s)], std::sqrt(shift), 1e-5) << "slot " << s;
  }
}

TEST(CaoteScores, ASlotHoldingAllTheAttentionCannotBeDropped) {
  const std::vector<float> p = {0.0f, 1.0f};
  const std::vector<float> v = {1, 2};
  std::vector<float> o(1), out(2);
  caote_scores(p.data(), v.data(), 2, 1, o.data(), out.data());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_TRUE(std::isinf(out[1]));
}

TEST(ObcacheAccumulate, HandComputed) {
  // One query, D = 1: z = (0, ln 3) gives p = (1/4, 3/4); v = (2, 1), so o = 5/4.
  const float z1 = std::log(3.0f);
  const std::vector<float> z = {0.0f, z1};
  const std::vector<float> v = {2.0f, 1.0f};
  std::vector<float> probs(2), o(1), acc = {10.0f, 0.0f};
  obcache_accumulate(z.data(), 1, v.data(), 2, 1, probs.data(), o.data(), acc.data());
  EXPECT_FLOAT_EQ(o[0], 1.25f);
  EXPECT_FLOAT_EQ(acc[0], 10.0f + 0.0625f * 4.0f);  // z = 0: the value term alone, (p v)^2
  const float delta = (1.0f + z1) * 1.0f - z1 * 1.25f;
  EXPECT_NEAR(acc[1], 0.5625f * delta * delta, 1e-6);
}

TEST(ObcacheAccumulate, IsTheSquaredRateAtWhichShrinkingTheSlotMovesTheOutput) {
  // The definition: scale slot s's value and logit by (1 - e) (e = 1 prunes
  // both); the score is |d output / d e|^2 at e = 0, summed over the queries.
  const int32_t n = 6;
  const int D = 4;
  const int32_t rows = 2;
  std::vector<float> z(size_t(rows) * n), v(size_t(n) * D);
  for (size_t i = 0; i < z.size(); ++i) z[i] = 1.5f * std::sin(1.3f * float(i) + 0.4f);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.9f * float(i)) * 2.0f;
  const auto output = [&](int32_t r, int32_t s, double e, int d) {
    double total = 0, sum = 0;
    for (int32_t j = 0; j < n; ++j) {
      const double w = std::exp(double(z[size_t(r) * n + j]) * (j == s ? 1.0 - e : 1.0));
      total += w;
      sum += w * double(v[size_t(j) * D + d]) * (j == s ? 1.0 - e : 1.0);
    }
    return sum / total;
  };
  std::vector<float> probs(n), o(D), acc(n, 0.5f);
  obcache_accumulate(z.data(), rows, v.data(), n, D, probs.data(), o.data(), acc.data());
  const double e = 1e-4;
  for (int32_t s = 0; s < n; ++s) {
    double want = 0.5;
    for (int32_t r = 0; r < rows; ++r) {
      for (int d = 0; d < D; ++d) {
        const double rate = (output(r, s, e, d) - output(r, s, -e, d)) / (2 * e);
        want += rate * rate;
      }
    }
    EXPECT_NEAR(acc[size_t(s)], want, 1e-4 * want) << "slot " << s;
  }
}

TEST(ObcacheAccumulate, MaskedSlotsAndRowsAddNothing) {
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0 sees slots 0 and 1 only; row 1 sees nothing.
  const std::vector<float> z = {0.5f, -0.5f, -inf, -inf, -inf, -inf};
  const std::vector<float> v = {1.0f, -1.0f, 7.0f};
  std::vector<float> probs(3), o(1), acc = {0.0f, 0.0f, 3.0f};
  obcache_accumulate(z.data(), 2, v.data(), 3, 1, probs.data(), o.data(), acc.data());
  EXPECT_GT(acc[0], 0.0f);
  EXPECT_GT(acc[1], 0.0f);
  EXPECT_EQ(acc[2], 3.0f);
  EXPECT_TRUE(std::isfinite(acc[0]) && std::isfinite(acc[1]));
}

}  // namespace
}  // namespace lazykv::cpu
