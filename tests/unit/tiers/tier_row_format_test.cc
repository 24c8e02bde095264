// The row format of demoted KV: f16 is the cache's bytes exactly; Q8_0 is
// about half the bytes and within its quantization step of every value.
#include "worker/tiers/tier_row_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"

namespace lazykv::tiers {
namespace {

std::vector<uint16_t> random_row(int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> value(0.0f, 2.0f);
  std::vector<uint16_t> row(static_cast<size_t>(dim));
  for (uint16_t& x : row) x = fp32_to_fp16(value(rng));
  return row;
}

TEST(TierRowFormat, F16IsTheCachesBytesExactly) {
  const TierRowFormat format(64, /*q8=*/false);
  EXPECT_EQ(format.name(), "f16");
  ASSERT_EQ(format.row_bytes(), 128u);
  const std::vector<uint16_t> row = random_row(64, 1);
  std::vector<uint8_t> bytes(format.row_bytes());
  std::vector<uint16_t> back(64);
  format.encode(row.data(), bytes.data());
  format.decode(bytes.data(), back.data());
  EXPECT_EQ(back, row);
}

TEST(TierRowFormat, Q8HalvesTheBytesWithinOneQuantizationStep) {
  const TierRowFormat format(128, /*q8=*/true);
  EXPECT_EQ(format.name(), "q8_0");
  ASSERT_EQ(format.row_bytes(), 4u * 34u);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::vector<uint16_t> row = random_row(128, seed);
    std::vector<uint8_t> bytes(format.row_bytes());
    std::vector<uint16_t> back(128);
    format.encode(row.data(), bytes.data());
    format.decode(bytes.data(), back.data());
    for (size_t block = 0; block < 4; ++block) {
      float amax = 0;
      for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::abs(fp16_to_fp32(row[block * 32 + i])));
      for (size_t i = block * 32; i < block * 32 + 32; ++i) {
        // Half a step of the int8 grid, plus the f16 rounding of scale and result.
        EXPECT_NEAR(fp16_to_fp32(back[i]), fp16_to_fp32(row[i]), amax / 127.0f * 0.51f + 4e-3f * amax)
            << "seed " << seed << " value " << i;
      }
    }
  }
}

TEST(TierRowFormat, AHeadDimensionQ8CannotSplitStaysF16) {
  const TierRowFormat format(80, /*q8=*/true);
  EXPECT_EQ(format.name(), "f16");
  EXPECT_EQ(format.row_bytes(), 160u);
}

TEST(TierRowFormat, AHeadDimensionOutOfRangeIsAClearError) {
  for (int dim : {0, -1, TierRowFormat::kMaxHeadDim + 1}) {
    try {
      TierRowFormat format(dim, true);
      ADD_FAILURE() << "head_dim " << dim << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  }
}

}  // namespace
}  // namespace lazykv::tiers
