// The AMX tiles' exact matmul against a double-precision reference and
// against the f32 panels it replaces. Skipped where the CPU has no AMX-BF16.
#include "kernels/cpu/matmul_amx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/quant.h"
#include "kernel_test_util.h"

namespace lazykv::cpu {
namespace {

using testing::quantize;
using testing::random_floats;

class MatmulAmxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!amx_bf16_usable()) GTEST_SKIP() << "this CPU (or this build) has no AMX-BF16 tiles";
  }
  void TearDown() override { set_amx_enabled(true); }

  // y of matmul(w, x) with the tiles on or off.
  static std::vector<float> run(const WeightMatrix& w, const std::vector<float>& x, int64_t batch, int threads,
                                bool amx) {
    set_amx_enabled(amx);
    EXPECT_EQ(matmul_amx_takes(w, batch), amx);
    std::vector<float> scratch(matmul_scratch_bytes(w, batch, threads) / sizeof(float) + 16);
    auto* aligned = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
    std::vector<float> y(size_t(batch * w.rows), std::nanf(""));
    ThreadPool pool(threads);
    matmul(w, x.data(), batch, y.data(), aligned, pool);
    return y;
  }

  // Every output within f32 rounding of the double-precision dot, for both
  // paths; the two paths within that of each other.
  static void check(DType type, int64_t rows, int64_t cols, int64_t batch, int threads, float x_scale) {
    SCOPED_TRACE(std::string(dtype_traits(type).name) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                 " batch=" + std::to_string(batch) + " threads=" + std::to_string(threads));
    const auto w_q = quantize(type, random_floats(size_t(rows * cols), 7, 0.3f));
    auto x = random_floats(size_t(batch * cols), 8, x_scale);
    for (size_t i = 0; i < x.size(); i += 97) x[i] *= 300.0f;  // outliers, as activations have
    const WeightMatrix w{type, rows, cols, w_q.data()};
    const auto amx = run(w, x, batch, threads, true);
    const auto panels = run(w, x, batch, threads, false);

    std::vector<float> w_f(size_t(rows * cols));
    const size_t stride = row_bytes(type, size_t(cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(type, w_q.data() + r * stride, w_f.data() + r * cols, cols);
    for (int64_t t = 0; t < batch; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const auto [dot, magnitude] = testing::reference_dot(&w_f[r * cols], &x[t * cols], cols);
        const size_t i = size_t(t * rows + r);
        ASSERT_NEAR(amx[i], dot, 1e-6 * magnitude + 1e-9) << "row " << r << " token " << t;
        ASSERT_NEAR(amx[i], panels[i], 2e-6 * magnitude + 1e-9) << "row " << r << " token " << t;
      }
    }
  }
};

// Shapes past every edge: rows not a multiple of 16, tokens not a multiple
// of 32, columns in several 512-column passes and a part of one, one and
// several row groups a thread, more tokens than one pass holds (512).
TEST_F(MatmulAmxTest, EveryTypeMatchesTheReferenceToF32Rounding) {
  for (DType type : testing::weight_types()) {
    const int64_t cols = testing::is_k_quant(type) ? 768 : 608;
    check(type, 37, cols, 72, 2, 1.0f);  // past 64 tokens: Q4_1, Q8_0 stream their rows up to there
  }
}

TEST_F(MatmulAmxTest, LargeShapesAndThreadCounts) {
  check(DType::kQ4_K, 560, 1024, 40, 2, 1.0f);  // two row groups a thread, two passes of columns
  check(DType::kQ6_K, 50, 2304, 33, 3, 1.0f);
  check(DType::kQ4_K, 64, 512, 96, 2, 1.0f);  // every tile pair straight to y
  check(DType::kQ4_1, 16, 64, 1100, 2, 1.0f);  // three passes of tokens
  check(DType::kQ8_0, 300, 128, 96, 1, 1.0f);
}

// Tiny and huge activations keep their relative precision: the parts are
// floating point, not fixed point.
TEST_F(MatmulAmxTest, ActivationsFarFromOneKeepTheirPrecision) {
  check(DType::kQ4_K, 40, 512, 32, 2, 1e-5f);
  check(DType::kQ4_K, 40, 512, 32, 2, 1e4f);
}

TEST_F(MatmulAmxTest, FewTokensAndOddColumnsStayOffTheTiles) {
  const std::vector<uint8_t> w_q = quantize(DType::kF32, random_floats(16 * 48, 9, 1.0f));
  EXPECT_FALSE(matmul_amx_takes(WeightMatrix{DType::kF32, 16, 48, w_q.data()}, 64));  // 48 columns
  EXPECT_FALSE(matmul_amx_takes(WeightMatrix{DType::kF32, 16, 32, w_q.data()}, 31));
  EXPECT_TRUE(matmul_amx_takes(WeightMatrix{DType::kF32, 16, 32, w_q.data()}, 32));
}

}  // namespace
}  // namespace lazykv::cpu
