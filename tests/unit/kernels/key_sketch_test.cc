// The 4-bit key sketch of lazy+tiers' probe: every key lies in its cell, so
// the sketch bound is never below the true dot product, and it is far
// tighter than the block-wide bound it refines.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "common/fp16.h"
#include "kernels/cpu/key_sketch.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace lazykv::cpu {
namespace {

struct SketchedBlock {
  SketchedBlock(int32_t rows, int dim, uint32_t seed) : rows(rows), dim(dim) {
    const std::vector<float> x = testing::random_floats(size_t(rows) * size_t(dim), seed, 3.0f);
    keys.resize(x.size());
    lo.assign(size_t(dim), 1e30f);
    hi.assign(size_t(dim), -1e30f);
    for (size_t i = 0; i < x.size(); ++i) {
      // Dimension 0 is constant, dimension 1 spans a tiny range: the edge cases.
      const int d = int(i % size_t(dim));
      const float value = d == 0 ? 0.75f : d == 1 ? 1.0f + x[i] * 1e-3f : x[i] * float(1 + d % 5);
      keys[i] = fp32_to_fp16(value);
      lo[size_t(d)] = std::min(lo[size_t(d)], fp16_to_fp32(keys[i]));
      hi[size_t(d)] = std::max(hi[size_t(d)], fp16_to_fp32(keys[i]));
    }
    sketch.resize(size_t(rows) * key_sketch_bytes(dim));
    encode_key_sketch(keys.data(), rows, dim, lo.data(), hi.data(), sketch.data());
  }
  double dot(const float* q, int32_t r) const {
    double sum = 0;
    for (int d = 0; d < dim; ++d) sum += double(q[d]) * fp16_to_fp32(keys[size_t(r) * size_t(dim) + size_t(d)]);
    return sum;
  }
  double block_bound(const float* q) const {
    double sum = 0;
    for (int d = 0; d < dim; ++d) sum += std::max(double(q[d]) * lo[size_t(d)], double(q[d]) * hi[size_t(d)]);
    return sum;
  }
  int32_t rows;
  int dim;
  std::vector<uint16_t> keys;
  std::vector<float> lo, hi;
  std::vector<uint8_t> sketch;
};

TEST(KeySketch, BoundsEveryRowFromAboveAndIsTighterThanTheBlockBound) {
  for (int dim : {64, 63, 128}) {
    const SketchedBlock block(200, dim, 11u + uint32_t(dim));
    std::vector<float> table(size_t(dim) * kKeySketchCells), bounds(size_t(block.rows));
    double sketch_slack = 0, block_slack = 0;
    for (uint32_t trial = 0; trial < 20; ++trial) {
      const std::vector<float> q = testing::random_floats(size_t(dim), 1000u + trial, 2.0f);
      key_sketch_table(q.data(), dim, block.lo.data(), block.hi.data(), table.data());
      key_sketch_bounds(table.data(), block.sketch.data(), block.rows, dim, bounds.data());
      const double block_bound = block.block_bound(q.data());
      for (int32_t r = 0; r < block.rows; ++r) {
        const double exact = block.dot(q.data(), r);
        ASSERT_GE(double(bounds[size_t(r)]), exact - 1e-4 * (1 + std::abs(exact))) << "dim " << dim << " row " << r;
        ASSERT_LE(double(bounds[size_t(r)]), block_bound + 1e-4 * (1 + std::abs(block_bound)));
        sketch_slack += double(bounds[size_t(r)]) - exact;
        block_slack += block_bound - exact;
      }
    }
    // 16 cells per dimension: the slack is about a sixteenth of the block's.
    EXPECT_LT(sketch_slack, block_slack / 8) << "dim " << dim;
  }
}

TEST(KeySketch, EveryKeyLiesInItsCell) {
  const int dim = 64;
  const SketchedBlock block(300, dim, 5);
  // A one-hot query of either sign bounds one coordinate from above and below.
  std::vector<float> q(static_cast<size_t>(dim)), table(size_t(dim) * kKeySketchCells), bounds(size_t(block.rows));
  for (int d = 0; d < dim; ++d) {
    for (float sign : {1.0f, -1.0f}) {
      std::fill(q.begin(), q.end(), 0.0f);
      q[size_t(d)] = sign;
      key_sketch_table(q.data(), dim, block.lo.data(), block.hi.data(), table.data());
      key_sketch_bounds(table.data(), block.sketch.data(), block.rows, dim, bounds.data());
      const float cell = (block.hi[size_t(d)] - block.lo[size_t(d)]) / kKeySketchCells;
      for (int32_t r = 0; r < block.rows; ++r) {
        const float x = sign * fp16_to_fp32(block.keys[size_t(r) * size_t(dim) + size_t(d)]);
        ASSERT_GE(bounds[size_t(r)], x) << "dim " << d << " row " << r;
        ASSERT_LE(bounds[size_t(r)], x + cell * 1.001f + 1e-6f) << "dim " << d << " row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace lazykv::cpu
