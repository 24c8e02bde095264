// The exact K-quant row kernels (kquant_rows.cc) at each width this build
// has, against a double-precision dot of the dequantized weights. matmul's
// tests reach only the widest; AVX2 machines run the 256-bit one-token Q4_K
// kernel, which an AVX-512 build would otherwise never test. (An AVX-512
// build runs it with AVX-512VL's nibble table; the plain-AVX2 conversion
// runs only where the build targets AVX2 alone.)
#include "kernels/cpu/kquant_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/unit/kernels/kernel_test_util.h"

namespace lazykv::cpu {
namespace {

void check_rows(DType type, int n_tok, KQuantRowsWidth width) {
  SCOPED_TRACE(std::string(dtype_traits(type).name) + " tokens=" + std::to_string(n_tok) +
               (width == KQuantRowsWidth::k256 ? " 256-bit" : " widest"));
  const int64_t rows = 7, cols = 768;  // odd rows: the two-row tiles and the single-row tail
  const auto w_f = testing::random_floats(size_t(rows * cols), 3 + uint32_t(n_tok), 0.3f);
  const auto x = testing::random_floats(size_t(n_tok * cols), 5 + uint32_t(n_tok));
  const auto w_q = testing::quantize(type, w_f);
  const auto w_deq = testing::dequantize(type, w_q, w_f.size());
  const WeightMatrix w{type, rows, cols, w_q.data()};
  std::vector<float> y(size_t(n_tok * rows), std::nanf("")), scratch(2 * size_t(cols));
  RowChunks chunks(0, rows, 1);
  kquant_rows_f32(w, chunks, x.data(), n_tok, y.data(), rows, scratch.data(), width);
  for (int t = 0; t < n_tok; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double dot = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double(w_deq[size_t(r * cols + k)]) * x[size_t(t * cols + k)];
        dot += p;
        magnitude += std::fabs(p);
      }
      ASSERT_NEAR(y[size_t(t * rows + r)], dot, 1e-6 * magnitude + 1e-6) << "row " << r << " token " << t;
    }
  }
}

TEST(KQuantRows, EveryWidthMatchesTheReference) {
  if (!kHaveKQuantRows) GTEST_SKIP() << "this build has no K-quant row kernels (no AVX2)";
  for (DType type : {DType::kQ4_K, DType::kQ6_K}) {
    for (int n_tok = 1; kquant_rows_take(type, n_tok); ++n_tok) {
      for (KQuantRowsWidth width : {KQuantRowsWidth::kWidest, KQuantRowsWidth::k256}) check_rows(type, n_tok, width);
    }
  }
}

}  // namespace
}  // namespace lazykv::cpu
