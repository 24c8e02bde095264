// StepCost: the decode line and the prompt line it learns from observed
// steps, and the chunk it proposes for a stall bound.
#include "coordinator/scheduler/step_cost.h"

#include <gtest/gtest.h>

#include <limits>

namespace lazykv {
namespace {

// Seconds of a step under a known model: 5 ms per step plus 3 ms per decoding
// sequence, and for prompt tokens 40.1 ms fixed plus 0.5 ms each.
double seconds(int decode, int prompt) {
  return 0.005 + 0.003 * decode + (prompt > 0 ? 0.0401 + 0.0005 * prompt : 0);
}

TEST(StepCostTest, UnknownUntilObserved) {
  StepCost cost;
  EXPECT_FALSE(cost.decode_seconds(4));
  EXPECT_FALSE(cost.prefill_cost());
  EXPECT_EQ(cost.prefill_chunk(0.1), -1);
  cost.observe(4, 0, 0.04);
  ASSERT_TRUE(cost.decode_seconds(4));
  EXPECT_DOUBLE_EQ(*cost.decode_seconds(4), 0.04);
  EXPECT_EQ(cost.prefill_chunk(0.1), -1) << "decoding alone says nothing of prompt tokens";
}

TEST(StepCostTest, TheDecodeLineHasAFixedPart) {
  StepCost cost;
  for (int k = 1; k <= 8; ++k) cost.observe(k, 0, seconds(k, 0));
  ASSERT_TRUE(cost.decode_seconds(16));
  EXPECT_NEAR(*cost.decode_seconds(16), 0.053, 1e-12) << "5 ms + 16 · 3 ms, beyond any batch seen";
  // A mixed step of more sequences than any decode-only step: its prompt
  // tokens are charged only what decoding would not have cost.
  cost.observe(16, 100, seconds(16, 100));
  ASSERT_TRUE(cost.prefill_cost());
  EXPECT_NEAR(cost.prefill_cost()->slope, 0.000901, 1e-12) << "(40.1 + 50 ms) / 100 tokens: one size, below zero";
  EXPECT_EQ(cost.prefill_cost()->intercept, 0);
}

TEST(StepCostTest, SeparatesFixedAndPerTokenCostsBesideDecoding) {
  StepCost cost;
  cost.observe(8, 0, seconds(8, 0));
  cost.observe(4, 0, seconds(4, 0));
  cost.observe(8, 100, seconds(8, 100));
  cost.observe(6, 37, seconds(6, 37));
  cost.observe(0, 512, seconds(0, 512) - 0.005);  // nothing decoding: no step overhead to take out
  cost.observe(8, 0, seconds(8, 0));
  cost.observe(7, 16, seconds(7, 16));
  EXPECT_NEAR(*cost.decode_seconds(8), seconds(8, 0), 1e-12);
  ASSERT_TRUE(cost.prefill_cost());
  EXPECT_NEAR(cost.prefill_cost()->intercept, 0.0401, 1e-9);
  EXPECT_NEAR(cost.prefill_cost()->slope, 0.0005, 1e-12);
  EXPECT_EQ(cost.prefill_chunk(0.150), 219) << "(150 - 40.1) / 0.5 = 219.8";
  EXPECT_EQ(cost.prefill_chunk(0.2003), 320) << "(200.3 - 40.1) / 0.5";
  // 80.1 ms would allow (80.1 - 40.1) / 0.5 = 80 tokens, whose 40.1 ms fixed
  // part is more than half of the 80.1 ms they add: the chunk is the
  // smallest whose fixed part is half, 40.1 / 0.5 = 80.2 tokens.
  EXPECT_EQ(cost.prefill_chunk(0.0801), 81);
  EXPECT_EQ(cost.prefill_chunk(0), 81) << "no chunk meets a zero bound: the efficient one";
}

// Under a steady backlog every chunk has the same size; the fixed part
// learned before stays (else the chunk would fall to a line through zero).
TEST(StepCostTest, KeepsTheFixedPartWhenChunksStopVarying) {
  StepCost cost;
  cost.observe(4, 0, seconds(4, 0));
  for (int p : {16, 200, 64}) cost.observe(4, p, seconds(4, p));
  ASSERT_NEAR(cost.prefill_cost()->intercept, 0.0401, 1e-9);
  for (int i = 0; i < 200; ++i) cost.observe(4, 81, seconds(4, 81));
  ASSERT_TRUE(cost.prefill_cost());
  EXPECT_NEAR(cost.prefill_cost()->intercept, 0.0401, 1e-9);
  EXPECT_NEAR(cost.prefill_cost()->slope, 0.0005, 1e-9);
  EXPECT_EQ(cost.prefill_chunk(0.0801), 81);
}

TEST(StepCostTest, WithoutAFixedCostTheBoundAloneSetsTheChunk) {
  StepCost cost;
  for (int p : {7, 40, 40, 13, 40}) cost.observe(0, p, 0.001 * p);
  ASSERT_TRUE(cost.prefill_cost());
  EXPECT_NEAR(cost.prefill_cost()->slope, 0.001, 1e-12);
  EXPECT_NEAR(cost.prefill_cost()->intercept, 0, 1e-12);
  EXPECT_EQ(cost.prefill_chunk(0.0405), 40);
  EXPECT_LE(cost.prefill_chunk(0.0005), 1) << "under one token's cost (the scheduler's floor then applies)";
}

TEST(StepCostTest, ChunksSmallerThanTheFittedMinimumAreLeftOut) {
  StepCost cost;
  cost.observe(0, StepCost::kMinFittedChunk - 1, 0.001);  // a remainder that ran another kernel
  EXPECT_FALSE(cost.prefill_cost());
  cost.observe(0, StepCost::kMinFittedChunk, 0.016);
  EXPECT_DOUBLE_EQ(cost.prefill_cost()->slope, 0.001);
}

// Decode-only steps of one batch size give a line through zero, which
// overstates a larger batch by the step's own overhead: a mixed step of
// another batch size waits until the decode line has an intercept.
TEST(StepCostTest, NoDecodeCostExtrapolatedFromALineThroughZero) {
  StepCost cost;
  cost.observe(1, 0, seconds(1, 0));
  cost.observe(3, 100, seconds(3, 100));
  EXPECT_FALSE(cost.prefill_cost()) << "3 sequences from a line through 1";
  cost.observe(1, 100, seconds(1, 100));
  ASSERT_TRUE(cost.prefill_cost()) << "the same batch size as measured";
  EXPECT_NEAR(cost.prefill_cost()->slope, 0.000901, 1e-12);
  cost.observe(4, 0, seconds(4, 0));  // now the decode line has its intercept
  cost.observe(3, 40, seconds(3, 40));
  EXPECT_NEAR(cost.prefill_cost()->intercept, 0.0401, 1e-9);
  EXPECT_NEAR(cost.prefill_cost()->slope, 0.0005, 1e-12);
}

TEST(StepCostTest, AMixedStepBeforeAnyDecodeOnlyStepIsIgnored) {
  StepCost cost;
  cost.observe(8, 100, 1.0);  // how much of the second is decoding is unknown
  EXPECT_FALSE(cost.prefill_cost());
  cost.observe(0, 100, 0.05);  // a prompt alone
  EXPECT_DOUBLE_EQ(cost.prefill_cost()->slope, 0.0005);
}

TEST(StepCostTest, FollowsAChangeWithinTensOfSteps) {
  StepCost cost(0.9);
  for (int i = 0; i < 50; ++i) cost.observe(0, 32 + 32 * (i % 2), 0.001 * (32 + 32 * (i % 2)));
  EXPECT_NEAR(cost.prefill_cost()->slope, 0.001, 1e-9);
  // The machine gets four times slower (a larger model, a busy host).
  for (int i = 0; i < 60; ++i) cost.observe(0, 32 + 32 * (i % 2), 0.004 * (32 + 32 * (i % 2)));
  EXPECT_NEAR(cost.prefill_cost()->slope, 0.004, 0.0001);
}

// Prompt tokens that seem to cost nothing or less are noise: the cost is
// unknown (the scheduler then runs its smallest chunk), never free (which
// would lift the bound).
TEST(StepCostTest, NoiseGivesNoCostRatherThanAFreeOne) {
  StepCost cost;
  cost.observe(8, 0, 0.08);
  cost.observe(8, 4, 0.01);  // faster than decoding alone
  EXPECT_FALSE(cost.prefill_cost());
  EXPECT_EQ(cost.prefill_chunk(0.15), -1);
  // Bigger chunks faster: the line bends below zero; it is fitted under the
  // last trusted fixed part (none yet: zero) instead.
  StepCost falling;
  falling.observe(0, 10, 0.10);
  falling.observe(0, 100, 0.05);
  ASSERT_TRUE(falling.prefill_cost());
  EXPECT_EQ(falling.prefill_cost()->intercept, 0);
  EXPECT_GT(falling.prefill_cost()->slope, 0);
  EXPECT_EQ(cost.prefill_chunk(std::numeric_limits<double>::infinity()), -1);
  EXPECT_EQ(falling.prefill_chunk(std::numeric_limits<double>::infinity()), int64_t(1e15));
}

TEST(StepCostTest, IgnoresMeaninglessObservations) {
  StepCost cost;
  cost.observe(0, 0, 1.0);
  cost.observe(-1, 10, 1.0);
  cost.observe(1, -10, 1.0);
  cost.observe(0, 10, -1.0);
  cost.observe(0, 10, std::numeric_limits<double>::quiet_NaN());
  cost.observe(0, 10, std::numeric_limits<double>::infinity());
  EXPECT_FALSE(cost.decode_seconds(1));
  EXPECT_FALSE(cost.prefill_cost());
}

}  // namespace
}  // namespace lazykv
