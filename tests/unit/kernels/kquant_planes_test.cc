// The K-quant plane kernels (kquant_planes.cc) called directly: the exact
// mode against a double-precision dot of the dequantized weights, with
// ordinary activations (to the f32 kernels' tolerance) and with an outlier
// 1000x the rest (to the planes' stated bound: their error is relative to
// the largest value of each chunk of 32); both modes
// turn a non-finite activation into non-finite outputs. (matmul_test
// reaches them through matmul, int8 mode against vec_dot_scalar on Q8_K.)
#include "kernels/cpu/kquant_planes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "tests/unit/kernels/kernel_test_util.h"

namespace lazykv::cpu {
namespace {

// Odd rows: two-row tiles and a single-row tail. Short rows run one at a time, long ones (16
// blocks and more) two at a time for exact Q6_K.
constexpr int64_t kRows = 7, kCols = 768, kLongCols = 4096;

struct Planes {
  int64_t cols;
  std::vector<uint8_t> w_q;
  std::vector<float> w_deq;
  std::unique_ptr<uint8_t[]> scratch_owner;
  uint8_t* scratch;

  size_t scratch_bytes;

  // zero_chunk: the weights of columns [zero_chunk, zero_chunk + 32) of every row are zero.
  explicit Planes(DType type, int n_tok, int64_t zero_chunk = -1, int64_t n_cols = kCols,
                  KQuantPlanes planes = KQuantPlanes::kExact)
      : cols(n_cols) {
    auto w_f = testing::random_floats(size_t(kRows * cols), 3, 0.3f);
    for (int64_t r = 0; zero_chunk >= 0 && r < kRows; ++r) {
      std::fill_n(w_f.begin() + r * cols + zero_chunk, 32, 0.0f);
    }
    w_q = testing::quantize(type, w_f);
    w_deq = testing::dequantize(type, w_q, w_f.size());
    scratch_bytes = kquant_planes_scratch_bytes(cols, n_tok, planes);
    scratch_owner.reset(new uint8_t[scratch_bytes + 128]);
    scratch = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch_owner.get()) + 63) / 64 * 64);
    std::memset(scratch + scratch_bytes, 0xA5, 64);  // guard bytes after the end
  }

  // Rows [r_begin, r_end) into y[t * y_stride + r]; the rest of y stays NaN.
  std::vector<float> run(DType type, const std::vector<float>& x, int n_tok, KQuantPlanes planes,
                         int64_t r_begin = 0, int64_t r_end = kRows, int64_t y_stride = kRows) {
    const WeightMatrix w{type, kRows, cols, w_q.data()};
    std::vector<float> y(size_t(n_tok * y_stride), std::nanf(""));
    RowChunks rows(r_begin, r_end, 1);
    kquant_planes_rows(w, rows, x.data(), n_tok, y.data(), y_stride, scratch, planes);
    for (size_t i = 0; i < 64; ++i) EXPECT_EQ(scratch[scratch_bytes + i], 0xA5) << "scratch overrun";
    return y;
  }
};

void check_exact(DType type, int n_tok, bool outlier, int64_t cols) {
  SCOPED_TRACE(std::string(dtype_traits(type).name) + " tokens=" + std::to_string(n_tok) +
               " cols=" + std::to_string(cols) + (outlier ? " with an outlier" : ""));
  // The outlier's chunk of 32 (columns 288-319) meets zero weights: what is left is the
  // other chunks' error, which one s for a super-block would make far larger.
  Planes p(type, n_tok, outlier ? 288 : -1, cols);
  auto x = testing::random_floats(size_t(n_tok * cols), 5 + uint32_t(n_tok));
  if (outlier) {
    for (int t = 0; t < n_tok; ++t) x[size_t(t * cols + 300 + t)] = 1000.0f;
  }
  const auto y = p.run(type, x, n_tok, KQuantPlanes::kExact);
  for (int t = 0; t < n_tok; ++t) {
    const float* xt = x.data() + t * cols;
    for (int64_t r = 0; r < kRows; ++r) {
      const float* w = p.w_deq.data() + r * cols;
      double dot = 0.0, magnitude = 0.0, split_error = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        dot += double(w[k]) * xt[k];
        magnitude += std::fabs(double(w[k]) * xt[k]);
        // The planes' bound, 2·2^-15·s per activation (s: its chunk's max / 127), on a
        // weight of at most twice the largest in its chunk (the quants before the min is taken off).
        const int64_t chunk = k / 32 * 32;
        double chunk_max = 0.0, w_max = 0.0;
        for (int64_t j = chunk; j < chunk + 32; ++j) {
          chunk_max = std::max(chunk_max, double(std::fabs(xt[j])));
          w_max = std::max(w_max, double(std::fabs(w[j])));
        }
        split_error += 2.0 * w_max * 2.0 * std::ldexp(chunk_max / 127.0, -15);
      }
      // Ordinary activations: as exact as the f32 kernels (their tolerance in matmul_test).
      const double tolerance = outlier ? 1e-6 * magnitude + split_error : 1e-6 * magnitude + 1e-6;
      ASSERT_NEAR(y[size_t(t * kRows + r)], dot, tolerance) << "row " << r << " token " << t;
    }
  }
}

TEST(KQuantPlanes, ExactModeMatchesTheReference) {
  if (!kHaveKQuantPlanes) GTEST_SKIP() << "this build has no K-quant plane kernels (no AVX-512 VNNI)";
  for (DType type : {DType::kQ4_K, DType::kQ6_K}) {
    for (int n_tok = 1; kquant_planes_take(type, n_tok); ++n_tok) {
      for (int64_t cols : {kCols, kLongCols}) {
        check_exact(type, n_tok, false, cols);
        check_exact(type, n_tok, true, cols);
      }
    }
  }
}

TEST(KQuantPlanes, NonFiniteActivationsGiveNonFiniteOutputs) {
  if (!kHaveKQuantPlanes) GTEST_SKIP() << "this build has no K-quant plane kernels (no AVX-512 VNNI)";
  for (DType type : {DType::kQ4_K, DType::kQ6_K}) {
    for (KQuantPlanes planes : {KQuantPlanes::kExact, KQuantPlanes::kInt8}) {
      for (float bad : {std::nanf(""), INFINITY}) {
        SCOPED_TRACE(std::string(dtype_traits(type).name) + (planes == KQuantPlanes::kExact ? " exact " : " int8 ") +
                     std::to_string(bad));
        Planes p(type, 2, -1, kCols, planes);
        auto x = testing::random_floats(size_t(2 * kCols), 9);
        x[size_t(kCols + 517)] = bad;  // token 1 only
        const auto y = p.run(type, x, 2, planes);
        for (int64_t r = 0; r < kRows; ++r) {
          EXPECT_TRUE(std::isfinite(y[size_t(r)])) << "token 0, row " << r;
          EXPECT_FALSE(std::isfinite(y[size_t(kRows + r)])) << "token 1, row " << r;
        }
      }
    }
  }
}

// A row range that starts at an odd row, into a wider output: the same
// values as the whole matrix gives, and nothing written outside the range.
TEST(KQuantPlanes, ARowRangeWritesItsRowsOnly) {
  if (!kHaveKQuantPlanes) GTEST_SKIP() << "this build has no K-quant plane kernels (no AVX-512 VNNI)";
  constexpr int kTokens = 3;
  constexpr int64_t kBegin = 1, kEnd = 6, kStride = kRows + 3;
  for (DType type : {DType::kQ4_K, DType::kQ6_K}) {
    for (int64_t cols : {kCols, kLongCols}) {
      SCOPED_TRACE(std::string(dtype_traits(type).name) + " cols=" + std::to_string(cols));
      Planes p(type, kTokens, -1, cols);
      const auto x = testing::random_floats(size_t(kTokens * cols), 11);
      const auto whole = p.run(type, x, kTokens, KQuantPlanes::kExact);
      const auto part = p.run(type, x, kTokens, KQuantPlanes::kExact, kBegin, kEnd, kStride);
      for (int t = 0; t < kTokens; ++t) {
        for (int64_t r = 0; r < kStride; ++r) {
          const float got = part[size_t(t * kStride + r)];
          if (r >= kBegin && r < kEnd) {
            EXPECT_EQ(got, whole[size_t(t * kRows + r)]) << "token " << t << " row " << r;
          } else {
            EXPECT_TRUE(std::isnan(got)) << "token " << t << " row " << r << " written";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace lazykv::cpu
