// matmul against a naive per-(row, token) reference, for every weight type,
// several batch sizes, odd row counts and 1..3 threads.
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <tuple>

#include "common/error.h"
#include "common/thread_pool.h"
#include "kernels/cpu/quant.h"
#include "kernel_test_util.h"

namespace lazykv::cpu {
namespace {

using testing::quantize;
using testing::random_floats;

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(n), data(static_cast<uint8_t*>(::operator new(n + 64, std::align_val_t(64)))) {}
  ~AlignedBuffer() { ::operator delete(data, std::align_val_t(64)); }
  size_t size;
  uint8_t* data;
};

// Runs matmul on a random matrix and checks every output: the int8 kernels
// against vec_dot_scalar on the same quantized activations, the f32 kernels
// against a double-precision dot of the dequantized weights with x.
void check_matmul(DType type, int64_t rows, int64_t cols, int64_t batch, int threads, uint32_t seed,
                  ActivationPrecision precision) {
  SCOPED_TRACE(std::string(dtype_traits(type).name) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
               " batch=" + std::to_string(batch) + " threads=" + std::to_string(threads) +
               (precision == ActivationPrecision::kF32 ? " f32" : " int8"));
  const auto w_f = random_floats(static_cast<size_t>(rows * cols), seed, 0.3f);
  const auto x = random_floats(static_cast<size_t>(batch * cols), seed + 1);
  const auto w_q = quantize(type, w_f);
  const WeightMatrix w{type, rows, cols, w_q.data()};

  const size_t scratch_bytes = matmul_scratch_bytes(w, batch, threads, precision);
  AlignedBuffer scratch(scratch_bytes);
  std::memset(scratch.data, 0xA5, scratch_bytes + 64);  // guard bytes after the end
  std::vector<float> y(static_cast<size_t>(batch * rows), std::nanf(""));
  ThreadPool pool(threads);
  matmul(w, x.data(), batch, y.data(), scratch.data, pool, precision);
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(scratch.data[scratch_bytes + i], 0xA5) << "scratch overrun";

  // K-quant products past their token limit run on the f32 kernels in int8 mode too.
  const bool f32_kernels = matmul_runs_f32(w, batch, precision);
  if (f32_kernels) {
    std::vector<float> w_deq(static_cast<size_t>(rows * cols));
    const size_t w_row = row_bytes(type, static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(type, w_q.data() + r * w_row, w_deq.data() + r * cols, cols);
    for (int64_t t = 0; t < batch; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const auto [dot, magnitude] = testing::reference_dot(&w_deq[r * cols], &x[t * cols], cols);
        ASSERT_NEAR(y[t * rows + r], dot, 1e-6 * magnitude + 1e-6) << "row " << r << " token " << t;
      }
    }
    return;
  }

  const DType act_type = vec_dot_type(type);
  const size_t w_row = row_bytes(type, static_cast<size_t>(cols));
  for (int64_t t = 0; t < batch; ++t) {
    std::vector<float> x_row(x.begin() + t * cols, x.begin() + (t + 1) * cols);
    const auto a = quantize(act_type, x_row);
    for (int64_t r = 0; r < rows; ++r) {
      const float expected = vec_dot_scalar(type, cols, w_q.data() + r * w_row, a.data());
      double magnitude = 0.0;  // Σ|w·x| bounds the float-order rounding
      for (int64_t k = 0; k < cols; ++k) magnitude += std::fabs(w_f[r * cols + k] * x_row[k]);
      ASSERT_NEAR(y[t * rows + r], expected, 2e-6 * magnitude + 1e-6) << "row " << r << " token " << t;
    }
  }
}

class MatmulTest : public ::testing::TestWithParam<std::tuple<DType, int>> {};

constexpr ActivationPrecision kPrecisions[] = {ActivationPrecision::kF32, ActivationPrecision::kInt8};

TEST_P(MatmulTest, MatchesNaiveReference) {
  const auto [type, threads] = GetParam();
  const int64_t cols = testing::is_k_quant(type) ? 512 : 96;
  uint32_t seed = 1;
  for (ActivationPrecision precision : kPrecisions) {
    for (int64_t batch : {1, 2, 3, 4, 5, 8, 9, 64}) {  // up to 8: the K-quant planes (AVX-512 VNNI) or rows
      for (int64_t rows : {1, 5, 37}) check_matmul(type, rows, cols, batch, threads, seed++, precision);
    }
  }
}

TEST_P(MatmulTest, LargeEnoughToSplitAcrossThreads) {
  const auto [type, threads] = GetParam();
  const int64_t cols = testing::is_k_quant(type) ? 768 : 576;
  for (ActivationPrecision precision : kPrecisions) {
    check_matmul(type, 203, cols, 1, threads, 11, precision);
    check_matmul(type, 203, cols, 67, threads, 12, precision);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest,
                         ::testing::Combine(::testing::ValuesIn(testing::weight_types()), ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           return std::string(dtype_traits(std::get<0>(info.param)).name) + "_threads" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(Matmul, Int8ScratchIsZeroForFloatWeights) {
  const WeightMatrix w{DType::kF16, 8, 64, nullptr};
  EXPECT_EQ(matmul_scratch_bytes(w, 16, 1, ActivationPrecision::kInt8), 0u);
  const WeightMatrix q{DType::kQ8_0, 8, 64, nullptr};
  EXPECT_GE(matmul_scratch_bytes(q, 16, 1, ActivationPrecision::kInt8), 16 * row_bytes(DType::kQ8_0, 64));
}

TEST(Matmul, KnownSmallProduct) {
  // F32 weights: y = x · Wᵀ exactly for small integers.
  const std::vector<float> w = {1, 2, 3, 4, 0, 0, 0, 1, -1, -1, -1, -1};  // 3 rows x 4 cols
  const std::vector<float> x = {1, 1, 1, 1, 2, 0, 0, 5};                // 2 tokens
  std::vector<float> y(6);
  ThreadPool pool(2);
  const std::vector<float> expected = {10, 1, -4, 22, 5, -7};
  const WeightMatrix wm{DType::kF32, 3, 4, w.data()};
  matmul(wm, x.data(), 2, y.data(), nullptr, pool, ActivationPrecision::kInt8);
  EXPECT_EQ(y, expected);
  std::vector<float> scratch(matmul_scratch_bytes(wm, 2, pool.size()) / sizeof(float) + 16);
  matmul(wm, x.data(), 2, y.data(), scratch.data(), pool);
  EXPECT_EQ(y, expected);
}

TEST(Matmul, RejectsColumnsThatAreNotWholeBlocks) {
  std::vector<uint8_t> data(1024);
  std::vector<float> x(48), y(4);
  ThreadPool pool(1);
  EXPECT_THROW(matmul(WeightMatrix{DType::kQ4_1, 1, 48, data.data()}, x.data(), 1, y.data(), nullptr, pool), Error);
}

}  // namespace
}  // namespace lazykv::cpu
