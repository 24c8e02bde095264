// StepCost: the decode cost per sequence and the fixed and per-token cost of
// prompt tokens it learns from observed steps, and the chunk it proposes for
// a stall bound.
#include "coordinator/scheduler/step_cost.h"

#include <gtest/gtest.h>

#include <limits>

namespace lazykv {
namespace {

// Seconds of a step under a known model: 3 ms per decoding sequence, and for
// prompt tokens 40.1 ms fixed plus 0.5 ms each.
double seconds(int decode, int prompt) { return 0.003 * decode + (prompt > 0 ? 0.0401 + 0.0005 * prompt : 0); }

TEST(StepCostTest, UnknownUntilObserved) {
  StepCost cost;
  EXPECT_EQ(cost.decode_item_seconds(), 0);
  EXPECT_EQ(cost.prefill_cost().per_token, 0);
  EXPECT_EQ(cost.prefill_chunk(0.1), -1);
  cost.observe(4, 0, 0.04);
  EXPECT_DOUBLE_EQ(cost.decode_item_seconds(), 0.01);
  EXPECT_EQ(cost.prefill_chunk(0.1), -1) << "decoding alone says nothing of prompt tokens";
}

TEST(StepCostTest, OneChunkSizeGivesALineThroughZero) {
  StepCost cost;
  cost.observe(8, 0, seconds(8, 0));
  cost.observe(8, 100, seconds(8, 100));
  cost.observe(8, 100, seconds(8, 100));
  const StepCost::PrefillCost c = cost.prefill_cost();
  EXPECT_EQ(c.fixed, 0) << "one size cannot tell the fixed part from the per-token part";
  EXPECT_NEAR(c.per_token, 0.000901, 1e-12);  // (40.1 + 50 ms) / 100 tokens
}

TEST(StepCostTest, SeparatesFixedAndPerTokenCostsBesideDecoding) {
  StepCost cost;
  cost.observe(8, 0, seconds(8, 0));
  cost.observe(8, 100, seconds(8, 100));
  cost.observe(6, 37, seconds(6, 37));
  cost.observe(0, 512, seconds(0, 512));
  cost.observe(8, 0, seconds(8, 0));
  cost.observe(7, 16, seconds(7, 16));
  EXPECT_NEAR(cost.decode_item_seconds(), 0.003, 1e-12);
  const StepCost::PrefillCost c = cost.prefill_cost();
  EXPECT_NEAR(c.fixed, 0.0401, 1e-9);
  EXPECT_NEAR(c.per_token, 0.0005, 1e-12);
  EXPECT_EQ(cost.prefill_chunk(0.150), 219) << "(150 - 40.1) / 0.5 = 219.8";
  EXPECT_EQ(cost.prefill_chunk(0.2003), 320) << "(200.3 - 40.1) / 0.5";
  // 80.1 ms would allow (80.1 - 40.1) / 0.5 = 80 tokens, whose 40.1 ms fixed
  // part is more than half of the 80.1 ms they add: the chunk is the
  // smallest whose fixed part is half, 40.1 / 0.5 = 80.2 tokens.
  EXPECT_EQ(cost.prefill_chunk(0.0801), 81);
  EXPECT_EQ(cost.prefill_chunk(0), 81) << "no chunk meets a zero bound: the efficient one";
}

TEST(StepCostTest, WithoutAFixedCostTheBoundAloneSetsTheChunk) {
  StepCost cost;
  for (int p : {7, 40, 40, 13, 40}) cost.observe(0, p, 0.001 * p);
  EXPECT_NEAR(cost.prefill_cost().per_token, 0.001, 1e-12);
  EXPECT_NEAR(cost.prefill_cost().fixed, 0, 1e-12);
  EXPECT_EQ(cost.prefill_chunk(0.0405), 40);
  EXPECT_LE(cost.prefill_chunk(0.0005), 1) << "under one token's cost (the scheduler's floor then applies)";
}

TEST(StepCostTest, AMixedStepBeforeAnyDecodeOnlyStepIsIgnored) {
  StepCost cost;
  cost.observe(8, 100, 1.0);  // how much of the second is decoding is unknown
  EXPECT_EQ(cost.prefill_cost().per_token, 0);
  cost.observe(0, 100, 0.05);  // a prompt alone
  EXPECT_DOUBLE_EQ(cost.prefill_cost().per_token, 0.0005);
}

TEST(StepCostTest, FollowsAChangeWithinTensOfSteps) {
  StepCost cost(0.9);
  for (int i = 0; i < 50; ++i) cost.observe(0, 32 + 32 * (i % 2), 0.001 * (32 + 32 * (i % 2)));
  EXPECT_NEAR(cost.prefill_cost().per_token, 0.001, 1e-9);
  // The machine gets four times slower (a larger model, a busy host).
  for (int i = 0; i < 60; ++i) cost.observe(0, 32 + 32 * (i % 2), 0.004 * (32 + 32 * (i % 2)));
  EXPECT_NEAR(cost.prefill_cost().per_token, 0.004, 0.0001);
}

TEST(StepCostTest, NoisyStepsCannotDriveTheCostToZeroOrBelow) {
  StepCost cost;
  cost.observe(8, 0, 0.08);
  cost.observe(8, 4, 0.01);  // faster than decoding alone: noise
  EXPECT_GT(cost.prefill_cost().per_token, 0);
  EXPECT_EQ(cost.prefill_chunk(0.15000049), 150'000) << "floor of 1 µs a token";
  EXPECT_EQ(cost.prefill_chunk(std::numeric_limits<double>::infinity()), int64_t(1e15));
  // A negative slope (bigger chunks faster) is noise too: the line goes through zero.
  StepCost falling;
  falling.observe(0, 10, 0.10);
  falling.observe(0, 100, 0.05);
  EXPECT_EQ(falling.prefill_cost().fixed, 0);
  EXPECT_GT(falling.prefill_cost().per_token, 0);
}

TEST(StepCostTest, IgnoresMeaninglessObservations) {
  StepCost cost;
  cost.observe(0, 0, 1.0);
  cost.observe(-1, 10, 1.0);
  cost.observe(1, -10, 1.0);
  cost.observe(0, 10, -1.0);
  cost.observe(0, 10, std::numeric_limits<double>::quiet_NaN());
  cost.observe(0, 10, std::numeric_limits<double>::infinity());
  EXPECT_EQ(cost.decode_item_seconds(), 0);
  EXPECT_EQ(cost.prefill_cost().per_token, 0);
}

}  // namespace
}  // namespace lazykv
