// The CUDA backend against the CPU backend on random data. Every test that
// launches a kernel skips itself (GTEST_SKIP) where no CUDA device is usable;
// the argument and error checks at the end run everywhere.
#include "kernels/cuda/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "common/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/prefill_attention.h"

namespace lazykv::cuda {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void synchronize() { LAZYKV_CUDA_CHECK(cudaDeviceSynchronize()); }

// call() throws Error(kInvalidArgument): refused before anything launches.
template <class Call>
void expect_invalid(Call&& call) {
  try {
    call();
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device: the CUDA backend is not exercised";
  }
};

// Tolerance: |a - b| <= abs + rel * |b|.
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, float abs_tol, float rel_tol,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const float tol = abs_tol + rel_tol * std::fabs(expected[i]);
    if (!(std::fabs(actual[i] - expected[i]) <= tol) && reported++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: cuda " << actual[i] << " cpu " << expected[i] << " tol " << tol;
    }
  }
}

// ---- elementwise --------------------------------------------------------------

// Float accumulation order differs (tree vs double sum on the CPU): 1e-5 relative.
TEST_F(CudaOpsTest, RmsNormMatchesCpu) {
  const int64_t rows = 3, n = 1000;  // n not a multiple of the block size
  const auto x = random_floats(rows * n, 1, 2.0f);
  const auto weight = random_floats(n, 2);
  std::vector<float> expected(rows * n);
  for (int64_t r = 0; r < rows; ++r) cpu::rms_norm(&x[r * n], weight.data(), &expected[r * n], n, 1e-5f);

  DeviceBuffer<float> d_x(x), d_w(weight), d_y(rows * n);
  rms_norm(d_x.data(), d_w.data(), d_y.data(), rows, n, 1e-5f, nullptr);
  expect_close(d_y.to_host(), expected, 1e-6f, 1e-5f, "rms_norm");
  rms_norm(d_x.data(), d_w.data(), d_x.data(), rows, n, 1e-5f, nullptr);  // in place
  expect_close(d_x.to_host(), expected, 1e-6f, 1e-5f, "rms_norm in place");
}

// The fused residual add and norm: the same bits as the two ops, x updated too.
TEST_F(CudaOpsTest, AddRmsNormEqualsAddThenRmsNorm) {
  const int64_t rows = 2, n = 4096;
  const auto x = random_floats(rows * n, 3, 2.0f), y = random_floats(rows * n, 4), weight = random_floats(n, 5);
  DeviceBuffer<float> d_x(x), d_y(y), d_w(weight), d_out(rows * n);
  add_rms_norm(d_x.data(), d_y.data(), d_w.data(), d_out.data(), rows, n, 1e-5f, nullptr);
  DeviceBuffer<float> d_x2(x), d_out2(rows * n);
  add_inplace(d_x2.data(), d_y.data(), rows * n, nullptr);
  rms_norm(d_x2.data(), d_w.data(), d_out2.data(), rows, n, 1e-5f, nullptr);
  EXPECT_EQ(d_x.to_host(), d_x2.to_host());
  EXPECT_EQ(d_out.to_host(), d_out2.to_host());
  std::vector<float> sum(x);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
  EXPECT_EQ(d_x.to_host(), sum);
}

// expf and std::exp are both within ~1 ulp: 2e-6 relative.
TEST_F(CudaOpsTest, SiluMulMatchesCpu) {
  const int64_t n = 10007;
  const auto gate = random_floats(n, 3, 4.0f);
  const auto up = random_floats(n, 4);
  std::vector<float> expected(n);
  cpu::silu_mul(gate.data(), up.data(), expected.data(), n);

  DeviceBuffer<float> d_gate(gate), d_up(up), d_out(n);
  silu_mul(d_gate.data(), d_up.data(), d_out.data(), n, nullptr);
  expect_close(d_out.to_host(), expected, 1e-7f, 2e-6f, "silu_mul");
}

// One rounding each: exact.
TEST_F(CudaOpsTest, AddAndToF16MatchCpuExactly) {
  const int64_t n = 4099;
  auto x = random_floats(n, 5, 3.0f);
  const auto y = random_floats(n, 6);
  DeviceBuffer<float> d_x(x), d_y(y);
  DeviceBuffer<uint16_t> d_h(n);
  add_inplace(d_x.data(), d_y.data(), n, nullptr);
  to_f16(d_x.data(), d_h.data(), n, nullptr);

  cpu::add_inplace(x.data(), y.data(), n);
  std::vector<uint16_t> expected_h(n);
  cpu::to_f16(x.data(), expected_h.data(), n);
  EXPECT_EQ(d_x.to_host(), x);
  EXPECT_EQ(d_h.to_host(), expected_h);
}

// Angles up to ~3000 rad; sinf/cosf vs libm each within a couple of ulp: 2e-5.
TEST_F(CudaOpsTest, RopeMatchesCpuBothStyles) {
  const int n_heads = 3, head_dim = 64, n_rot = 48;  // partial rotary dims stay untouched
  const std::vector<int32_t> positions = {0, 1, 17, 3000};
  const int64_t n_tokens = static_cast<int64_t>(positions.size());
  std::vector<float> inv_freq(n_rot / 2);
  for (int i = 0; i < n_rot / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * float(i) / float(n_rot));
  for (const auto style : {RopeStyle::kInterleaved, RopeStyle::kNeox}) {
    for (const float mscale : {1.0f, 0.8f}) {
      const auto x = random_floats(n_tokens * n_heads * head_dim, 7);
      std::vector<float> expected = x;
      for (int64_t t = 0; t < n_tokens; ++t) {
        cpu::rope(&expected[t * n_heads * head_dim], n_heads, head_dim, n_rot, positions[t], inv_freq.data(), mscale,
                  style);
      }
      DeviceBuffer<float> d_x(x), d_freq(inv_freq);
      DeviceBuffer<int32_t> d_pos(positions);
      rope(d_x.data(), d_pos.data(), d_freq.data(), n_tokens, n_heads, head_dim, n_rot, mscale, style, nullptr);
      expect_close(d_x.to_host(), expected, 2e-5f, 2e-5f,
                   std::string("rope ") + (style == RopeStyle::kNeox ? "neox" : "interleaved"));
    }
  }
}

// The fused op against rope, rope, to_f16, to_f16: the same bits, partial
// rotary (n_rot < head_dim) included.
TEST_F(CudaOpsTest, RopeQkToF16EqualsTheSeparateOps) {
  const int n_q = 4, n_kv = 2, head_dim = 64;
  const std::vector<int32_t> positions = {0, 7, 300};
  const int64_t n_tokens = int64_t(positions.size());
  for (const int n_rot : {64, 32}) {
    std::vector<float> inv_freq(n_rot / 2);
    for (int i = 0; i < n_rot / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * float(i) / float(n_rot));
    for (const auto style : {RopeStyle::kInterleaved, RopeStyle::kNeox}) {
      SCOPED_TRACE("n_rot " + std::to_string(n_rot) + (style == RopeStyle::kNeox ? " neox" : " interleaved"));
      const auto q = random_floats(n_tokens * n_q * head_dim, 61), k = random_floats(n_tokens * n_kv * head_dim, 62);
      const auto v = random_floats(n_tokens * n_kv * head_dim, 63);
      DeviceBuffer<float> d_freq(inv_freq), d_v(v);
      DeviceBuffer<int32_t> d_pos(positions);
      DeviceBuffer<float> q1(q), k1(k), q2(q), k2(k);
      DeviceBuffer<uint16_t> k16_1(k.size()), v16_1(v.size()), k16_2(k.size()), v16_2(v.size());
      rope_qk_to_f16(q1.data(), k1.data(), d_v.data(), d_pos.data(), d_freq.data(), n_tokens, n_q, n_kv, head_dim,
                     n_rot, 0.9f, style, k16_1.data(), v16_1.data(), nullptr);
      rope(q2.data(), d_pos.data(), d_freq.data(), n_tokens, n_q, head_dim, n_rot, 0.9f, style, nullptr);
      rope(k2.data(), d_pos.data(), d_freq.data(), n_tokens, n_kv, head_dim, n_rot, 0.9f, style, nullptr);
      to_f16(k2.data(), k16_2.data(), int64_t(k.size()), nullptr);
      to_f16(d_v.data(), v16_2.data(), int64_t(v.size()), nullptr);
      EXPECT_EQ(q1.to_host(), q2.to_host());
      EXPECT_EQ(k16_1.to_host(), k16_2.to_host());
      EXPECT_EQ(v16_1.to_host(), v16_2.to_host());
    }
  }
}

// ---- dequantization ---------------------------------------------------------------

// The same block formulas; nvcc may contract d*q - m into an FMA (one
// rounding fewer), so allow a few ulp of values of magnitude ~1: 1e-6.
TEST_F(CudaOpsTest, DequantizeRowsMatchesCpu) {
  const int64_t rows = 3, n = 512;
  for (const DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ8_0,
                           DType::kQ4_K, DType::kQ6_K}) {
    const std::string name(dtype_traits(type).name);
    ASSERT_TRUE(dequantize_supported(type)) << name;
    const auto x = random_floats(rows * n, 8, 0.5f);
    const size_t row_size = row_bytes(type, n);
    std::vector<uint8_t> packed(rows * row_size);
    std::vector<float> expected(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::quantize_row(type, &x[r * n], &packed[r * row_size], n);
      cpu::dequantize_row(type, &packed[r * row_size], &expected[r * n], n);
    }
    DeviceBuffer<uint8_t> d_packed(packed);
    DeviceBuffer<float> d_out(rows * n);
    dequantize_rows(type, d_packed.data(), d_out.data(), rows, n, nullptr);
    expect_close(d_out.to_host(), expected, 1e-6f, 1e-6f, "dequantize " + name);
  }
}

// ---- matmul -------------------------------------------------------------------------

struct MatmulCase {
  DType type;
  int64_t rows, cols, batch;
};

std::string case_name(const MatmulCase& c) {
  return std::string(dtype_traits(c.type).name) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
         " batch " + std::to_string(c.batch);
}

// Random weights of c's shape quantized to its type: the GGML rows, their
// dequantized values and the tiled matrix on the device.
struct TiledWeights {
  std::vector<uint8_t> rows;
  std::vector<float> dequantized;
  DeviceBuffer<uint8_t> tiled;
  WeightMatrix matrix;
};

TiledWeights make_tiled_weights(const MatmulCase& c, uint32_t seed) {
  TiledWeights w;
  const auto w_f = random_floats(c.rows * c.cols, seed, 0.3f);
  const size_t row_size = row_bytes(c.type, c.cols);
  w.rows.resize(c.rows * row_size);
  w.dequantized.resize(c.rows * c.cols);
  for (int64_t r = 0; r < c.rows; ++r) {
    cpu::quantize_row(c.type, &w_f[r * c.cols], &w.rows[r * row_size], c.cols);
    cpu::dequantize_row(c.type, &w.rows[r * row_size], &w.dequantized[r * c.cols], c.cols);
  }
  DeviceBuffer<uint8_t> d_rows(w.rows);
  w.tiled = DeviceBuffer<uint8_t>(tiled_bytes(c.type, c.rows, c.cols));
  tile_weights(c.type, d_rows.data(), c.rows, c.cols, w.tiled.data(), nullptr);
  synchronize();  // d_rows goes away
  w.matrix = WeightMatrix{c.type, c.rows, c.cols, w.tiled.data()};
  return w;
}

// Each y[b][r] within tolerance · Σ|w||x| of the exact product of the
// dequantized weights (double accumulation); returns the exact products.
std::vector<double> expect_exact_product(const std::vector<float>& y, const TiledWeights& w,
                                         const std::vector<float>& x, const MatmulCase& c, double tolerance) {
  std::vector<double> exact(c.batch * c.rows);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t r = 0; r < c.rows; ++r) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < c.cols; ++k) {
        sum += double(w.dequantized[r * c.cols + k]) * x[b * c.cols + k];
        magnitude += std::fabs(double(w.dequantized[r * c.cols + k]) * x[b * c.cols + k]);
      }
      EXPECT_NEAR(y[b * c.rows + r], sum, tolerance * magnitude + 1e-6) << case_name(c) << " y[" << b << "][" << r << "]";
      exact[b * c.rows + r] = sum;
    }
  }
  return exact;
}

// Against the exact product of the dequantized weights (double accumulation):
// |err| <= 5e-5 · Σ|w||x| covers f32 summation (Q4_1 sums d·(q·x) and
// m·Σx separately, terms up to ~8x |w·x|) yet is ~0.1% of a typical output. Against cpu::matmul
// (default f32 activations, so only the summation order differs): the RMS
// difference stays under 1e-4 of the outputs' RMS (a wrong layout gives ~100%).
TEST_F(CudaOpsTest, MatmulMatchesCpu) {
  const std::vector<MatmulCase> cases = {
      {DType::kQ4_1, 37, 256, 1},  {DType::kQ4_1, 64, 1024, 5}, {DType::kQ4_1, 13, 96, 11},
      {DType::kQ8_0, 37, 256, 1},  {DType::kQ8_0, 64, 1024, 8}, {DType::kQ8_0, 13, 96, 17},
      {DType::kF16, 37, 256, 1},   {DType::kF16, 64, 1024, 9},  {DType::kF16, 13, 100, 3},  // 100: a partial chunk
      {DType::kBF16, 37, 256, 2},  {DType::kBF16, 70, 520, 4},  {DType::kQ4_0, 33, 512, 1},
      {DType::kQ4_0, 64, 2048, 6}, {DType::kQ4_1, 96, 4096, 2}, {DType::kQ8_0, 40, 4096, 3},  // many chunks per warp
      {DType::kQ4_1, 200, 512, 70}, {DType::kQ8_0, 130, 256, 64},  // many passes of 8 rows
      {DType::kQ4_1, 40, 17408, 2},  // 34 chunks per warp: Q4_1's Σx in two windows of 32 chunks
      {DType::kQ4_1, 8224, 256, 1},  {DType::kQ8_0, 8192, 128, 1},  // 257 and 256 tiles: 8 warps a tile
  };
  ThreadPool pool(2);
  for (const MatmulCase& c : cases) {
    const std::string name = case_name(c);
    ASSERT_TRUE(matmul_supported(c.type)) << name;
    const TiledWeights w = make_tiled_weights(c, 9);
    const auto x = random_floats(c.batch * c.cols, 10);
    DeviceBuffer<float> d_x(x), d_y(c.batch * c.rows);
    matmul(w.matrix, d_x.data(), c.batch, d_y.data(), nullptr);
    const std::vector<double> exact = expect_exact_product(d_y.to_host(), w, x, c, 5e-5);

    const cpu::WeightMatrix cpu_w{c.type, c.rows, c.cols, w.rows.data()};
    const size_t scratch_bytes = cpu::matmul_scratch_bytes(cpu_w, c.batch, pool.size());
    void* scratch = ::operator new(scratch_bytes + 64, std::align_val_t(64));
    std::vector<float> y_cpu(c.batch * c.rows);
    cpu::matmul(cpu_w, x.data(), c.batch, y_cpu.data(), scratch, pool);
    ::operator delete(scratch, std::align_val_t(64));
    const auto y = d_y.to_host();
    double diff2 = 0.0, norm2 = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      diff2 += (double(y[i]) - y_cpu[i]) * (double(y[i]) - y_cpu[i]);
      norm2 += exact[i] * exact[i];
    }
    EXPECT_LT(std::sqrt(diff2 / norm2), 1e-4) << name << ": cuda vs cpu::matmul";
  }
}

// f16 inputs keep 10 mantissa bits: a product is off by up to ~2^-10 of
// itself, so a sum by up to ~1e-3 of Σ|w||x| (2e-3 with margin). Partial
// tiles of rows and columns, a scratch smaller than the matrix (blocks of
// rows), every type; an activation beyond f16's range saturates.
TEST_F(CudaOpsTest, TensorCoreGemmMatchesTheExactProduct) {
  const std::vector<MatmulCase> cases = {{DType::kQ4_1, 200, 512, 70}, {DType::kQ8_0, 130, 256, 64},
                                         {DType::kF16, 100, 100, 65},  {DType::kBF16, 64, 1024, 128},
                                         {DType::kQ4_0, 37, 96, 97}};
  TensorCoreGemm gemm(nullptr);
  gemm.reserve(256, 1024, 128);  // every case in one block
  for (const MatmulCase& c : cases) {
    const TiledWeights w = make_tiled_weights(c, 31);
    const auto x = random_floats(c.batch * c.cols, 32);
    DeviceBuffer<float> d_x(x), d_y(c.batch * c.rows);
    gemm.run(w.matrix, d_x.data(), c.batch, d_y.data());
    expect_exact_product(d_y.to_host(), w, x, c, 2e-3);
  }
  // A scratch of 32 rows' room: the 200-row matrix in 7 blocks of rows.
  TensorCoreGemm small(nullptr);
  small.reserve(32, 512, 70);
  const MatmulCase c{DType::kQ8_0, 200, 512, 70};
  const TiledWeights w = make_tiled_weights(c, 33);
  DeviceBuffer<float> d_x(random_floats(c.batch * c.cols, 34)), d_whole(c.batch * c.rows), d_blocks(c.batch * c.rows);
  gemm.run(w.matrix, d_x.data(), c.batch, d_whole.data());
  small.run(w.matrix, d_x.data(), c.batch, d_blocks.data());
  expect_close(d_blocks.to_host(), d_whole.to_host(), 1e-4f, 1e-4f, "blocks of rows vs one block");
  // An outlier of 1e6 in x: its rows stay finite (saturated, not inf).
  std::vector<float> outlier = random_floats(c.batch * c.cols, 35);
  outlier[7] = 1e6f;
  DeviceBuffer<float> d_outlier(outlier), d_y(c.batch * c.rows);
  gemm.run(w.matrix, d_outlier.data(), c.batch, d_y.data());
  for (float v : d_y.to_host()) ASSERT_TRUE(std::isfinite(v));
  // A batch far beyond the reserved input (70 rows, with headroom): refused before any launch.
  expect_invalid([&] { small.run(w.matrix, d_x.data(), 1000, d_y.data()); });
}

// Q, K and V in one launch: each output exactly as its own matmul (the same
// per-tile arithmetic), for matrices of different heights and a batch.
TEST_F(CudaOpsTest, MatmulSharedInputEqualsSeparateMatmuls) {
  const int64_t cols = 512, heights[3] = {96, 16, 40};
  for (int64_t batch : {int64_t(1), int64_t(3)}) {
    const auto x = random_floats(batch * cols, 21);
    DeviceBuffer<float> d_x(x);
    std::vector<TiledWeights> tiled;
    std::vector<DeviceBuffer<float>> together, apart;
    WeightMatrix w[3];
    float* y[3];
    for (int i = 0; i < 3; ++i) {
      tiled.push_back(make_tiled_weights({DType::kQ4_1, heights[i], cols, batch}, uint32_t(22 + i)));
      w[i] = tiled.back().matrix;
      y[i] = together.emplace_back(batch * heights[i]).data();
      matmul(w[i], d_x.data(), batch, apart.emplace_back(batch * heights[i]).data(), nullptr);
    }
    matmul_shared_input(w, y, 3, d_x.data(), batch, nullptr);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(together[size_t(i)].to_host(), apart[size_t(i)].to_host()) << "matrix " << i << " batch " << batch;
    }
  }
  alignas(16) float dummy[4] = {};
  const WeightMatrix mixed[2] = {{DType::kQ4_1, 1, 32, dummy}, {DType::kQ8_0, 1, 32, dummy}};
  float* outs[2] = {dummy, dummy};
  try {
    matmul_shared_input(mixed, outs, 2, dummy, 1, nullptr);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differ in type or width"), std::string::npos) << e.what();
  }
}

// ---- int8 activations ---------------------------------------------------------------

// quantize_q8 on the host, as the kernel computes it: d = max|x| / 127,
// q = round-to-even(x · 127 / max|x|), s = d·Σq.
struct HostQ8 {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

HostQ8 host_quantize_q8(const std::vector<float>& x) {
  HostQ8 h;
  h.q.resize(x.size());
  for (size_t b = 0; b < x.size() / cpu::kQK; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < cpu::kQK; ++i) amax = std::max(amax, std::fabs(x[b * cpu::kQK + i]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < cpu::kQK; ++i) {
      const int q = int(std::nearbyint(x[b * cpu::kQK + i] * inv));
      h.q[b * cpu::kQK + i] = int8_t(q);
      sum += q;
    }
    h.d.push_back(amax / 127.0f);
    h.s.push_back(h.d.back() * float(sum));
  }
  return h;
}

// Device buffers of a [batch, cols] Q8Activations.
struct DeviceQ8 {
  DeviceBuffer<int8_t> q;
  DeviceBuffer<float> d, s;
  DeviceQ8(int64_t batch, int64_t cols) : q(batch * cols), d(batch * cols / 32), s(batch * cols / 32) {}
  Q8Activations view() { return {q.data(), d.data(), s.data()}; }
};

// The bytes equal the host's; d and s too (the same f32 operations). An
// all-zero block quantizes to zeros with d = 0.
TEST_F(CudaOpsTest, QuantizeQ8MatchesTheHost) {
  auto x = random_floats(3 * 256, 41, 2.0f);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
  const HostQ8 expected = host_quantize_q8(x);
  DeviceBuffer<float> d_x(x);
  DeviceQ8 out(3, 256);
  quantize_q8(d_x.data(), 3, 256, out.view(), nullptr);
  EXPECT_EQ(out.q.to_host(), expected.q);
  EXPECT_EQ(out.d.to_host(), expected.d);
  EXPECT_EQ(out.s.to_host(), expected.s);
  EXPECT_EQ(expected.d[2], 0.0f);
  expect_invalid([&] { quantize_q8(d_x.data(), 1, 100, out.view(), nullptr); });  // not a multiple of 32
}

// rms_norm, add_rms_norm and silu_mul on rows x n with and without a
// quantized output, against quantize_q8 of the output.
void check_quantized_outputs(int64_t rows, int64_t n) {
  const auto x = random_floats(rows * n, 51, 2.0f), y = random_floats(rows * n, 52), w = random_floats(n, 53);
  DeviceBuffer<float> d_y(y), d_w(w), d_out(rows * n);
  const auto check = [&](const std::string& what, const std::function<void(const Q8Activations*)>& op) {
    SCOPED_TRACE(what);
    DeviceQ8 fused(rows, n), apart(rows, n);
    const Q8Activations fused_view = fused.view();
    op(&fused_view);
    const auto out = d_out.to_host();
    op(nullptr);
    EXPECT_EQ(out, d_out.to_host());
    quantize_q8(d_out.data(), rows, n, apart.view(), nullptr);
    EXPECT_EQ(fused.q.to_host(), apart.q.to_host());
    EXPECT_EQ(fused.d.to_host(), apart.d.to_host());
    EXPECT_EQ(fused.s.to_host(), apart.s.to_host());
  };
  DeviceBuffer<float> d_x(x);
  check("rms_norm", [&](const Q8Activations* q8) {
    rms_norm(d_x.data(), d_w.data(), d_out.data(), rows, n, 1e-5f, nullptr, q8);
  });
  check("add_rms_norm", [&](const Q8Activations* q8) {
    DeviceBuffer<float> fresh(x);  // the add writes x
    add_rms_norm(fresh.data(), d_y.data(), d_w.data(), d_out.data(), rows, n, 1e-5f, nullptr, q8);
    synchronize();
  });
  check("silu_mul", [&](const Q8Activations* q8) {
    silu_mul(d_x.data(), d_y.data(), d_out.data(), rows * n, nullptr, q8);
  });
  // Rows one float off 16-byte alignment: the one-float-a-lane path.
  DeviceBuffer<float> shifted(rows * n + 1);
  LAZYKV_CUDA_CHECK(cudaMemcpy(shifted.data() + 1, d_x.data(), x.size() * sizeof(float), cudaMemcpyDeviceToDevice));
  check("rms_norm, unaligned input", [&](const Q8Activations* q8) {
    rms_norm(shifted.data() + 1, d_w.data(), d_out.data(), rows, n, 1e-5f, nullptr, q8);
  });
  DeviceQ8 q8(rows, n);
  const Q8Activations view = q8.view();
  expect_invalid([&] { rms_norm(d_x.data(), d_w.data(), d_out.data(), 1, 100, 1e-5f, nullptr, &view); });
}

// A norm or SiLU that writes its output quantized too: the same bytes as
// quantize_q8 of that output, which is itself unchanged. 576: a row whose
// last warp holds only part of its 4-float steps (SmolLM2's width).
TEST_F(CudaOpsTest, OpsWithAQuantizedOutputEqualQuantizeQ8OfTheirOutput) {
  for (const int64_t n : {int64_t(4096), int64_t(576)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    check_quantized_outputs(2, n);
  }
}

// Against the exact product of the dequantized weights and the dequantized
// activations (d·q; double accumulation): the integer sums are exact, so
// only f32 rounding of the per-block terms remains (5e-5 of Σ|w||x̂|, as
// for f32 activations). Against f32 activations, the quantization error
// (~0.6% of a Gaussian input's RMS per element): the RMS difference under 2%
// of the outputs' RMS, where a wrong layout gives ~100%.
TEST_F(CudaOpsTest, MatmulQ8MatchesTheExactProductOfQuantizedActivations) {
  const std::vector<MatmulCase> cases = {
      {DType::kQ4_1, 37, 256, 1}, {DType::kQ4_1, 64, 1024, 5}, {DType::kQ4_0, 33, 512, 1}, {DType::kQ4_0, 64, 2048, 6},
      {DType::kQ8_0, 37, 256, 1}, {DType::kQ8_0, 64, 1024, 8}, {DType::kQ4_1, 96, 4096, 2}, {DType::kQ8_0, 40, 4096, 3},
      {DType::kQ4_1, 130, 512, 19},  // two passes of 8 rows and a partial one: 32 warps a tile
      {DType::kQ4_1, 8224, 256, 1},  {DType::kQ8_0, 8192, 128, 3},  // 257 and 256 tiles: 8 warps a tile
  };
  for (const MatmulCase& c : cases) {
    const std::string name = case_name(c);
    ASSERT_TRUE(matmul_q8_supported(c.type)) << name;
    const TiledWeights w = make_tiled_weights(c, 42);
    const auto x = random_floats(c.batch * c.cols, 43);
    const HostQ8 hq = host_quantize_q8(x);
    std::vector<float> x_hat(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_hat[i] = hq.d[i / cpu::kQK] * float(hq.q[i]);
    DeviceBuffer<float> d_x(x), d_y(c.batch * c.rows), d_y32(c.batch * c.rows);
    DeviceQ8 xq(c.batch, c.cols);
    quantize_q8(d_x.data(), c.batch, c.cols, xq.view(), nullptr);
    float* y = d_y.data();
    matmul_q8_shared_input(&w.matrix, &y, 1, xq.view(), c.batch, nullptr);
    const std::vector<double> exact = expect_exact_product(d_y.to_host(), w, x_hat, c, 5e-5);

    matmul(w.matrix, d_x.data(), c.batch, d_y32.data(), nullptr);
    const auto y8 = d_y.to_host(), y32 = d_y32.to_host();
    double diff2 = 0.0, norm2 = 0.0;
    for (size_t i = 0; i < y8.size(); ++i) {
      diff2 += (double(y8[i]) - y32[i]) * (double(y8[i]) - y32[i]);
      norm2 += double(y32[i]) * y32[i];
    }
    EXPECT_LT(std::sqrt(diff2 / norm2), 2e-2) << name << ": int8 vs f32 activations";
    EXPECT_GT(diff2, 0.0) << name << ": int8 activations gave the f32 result exactly";
  }
}

TEST_F(CudaOpsTest, MatmulQ8SharedInputEqualsSeparateLaunchesAndRefusesOtherTypes) {
  const int64_t cols = 512, batch = 3, heights[3] = {96, 16, 40};
  DeviceBuffer<float> d_x(random_floats(batch * cols, 44));
  DeviceQ8 xq(batch, cols);
  quantize_q8(d_x.data(), batch, cols, xq.view(), nullptr);
  std::vector<TiledWeights> tiled;
  std::vector<DeviceBuffer<float>> together, apart;
  WeightMatrix w[3];
  float* y[3];
  for (int i = 0; i < 3; ++i) {
    tiled.push_back(make_tiled_weights({DType::kQ4_0, heights[i], cols, batch}, uint32_t(45 + i)));
    w[i] = tiled.back().matrix;
    y[i] = together.emplace_back(batch * heights[i]).data();
    float* alone = apart.emplace_back(batch * heights[i]).data();
    matmul_q8_shared_input(&w[i], &alone, 1, xq.view(), batch, nullptr);
  }
  matmul_q8_shared_input(w, y, 3, xq.view(), batch, nullptr);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(together[size_t(i)].to_host(), apart[size_t(i)].to_host()) << "matrix " << i;
  EXPECT_FALSE(matmul_q8_supported(DType::kF16));
  EXPECT_FALSE(matmul_q8_supported(DType::kBF16));
  const TiledWeights half = make_tiled_weights({DType::kF16, 8, cols, 1}, 48);
  float* out = together[0].data();
  expect_invalid([&] { matmul_q8_shared_input(&half.matrix, &out, 1, xq.view(), 1, nullptr); });
}

// ---- attention ------------------------------------------------------------------------

struct AttentionCase {
  int n_group, head_dim;
  int32_t n_slots, page_slots;
  int64_t max_pos;
};

// Probabilities 1e-6 absolute + 1e-5 relative, outputs and lse 2e-5.
void check_attention(const AttentionCase& c, uint32_t seed) {
  const std::string name = "group " + std::to_string(c.n_group) + " head_dim " + std::to_string(c.head_dim) +
                           " slots " + std::to_string(c.n_slots) + " max_pos " + std::to_string(c.max_pos);
  const int32_t n_pages = (c.n_slots + c.page_slots - 1) / c.page_slots;
  const size_t page_elems = size_t(c.page_slots) * c.head_dim;
  std::vector<std::vector<uint16_t>> key_pages(n_pages), value_pages(n_pages);
  for (int32_t p = 0; p < n_pages; ++p) {
    for (auto* pages : {&key_pages, &value_pages}) {
      const auto f = random_floats(page_elems, seed + 100 + 2 * p + (pages == &value_pages));
      (*pages)[p].resize(page_elems);
      cpu::to_f16(f.data(), (*pages)[p].data(), static_cast<int64_t>(page_elems));
    }
  }
  // Slots hold positions out of order (as after eviction and compaction).
  std::vector<int32_t> positions(c.n_slots);
  for (int32_t s = 0; s < c.n_slots; ++s) positions[s] = (s * 7) % std::max(c.n_slots, 1);
  const auto q = random_floats(size_t(c.n_group) * c.head_dim, seed);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));

  std::vector<const uint16_t*> host_keys, host_values;
  for (int32_t p = 0; p < n_pages; ++p) {
    host_keys.push_back(key_pages[p].data());
    host_values.push_back(value_pages[p].data());
  }
  const cpu::KvPages cpu_kv{host_keys.data(), host_values.data(), positions.data(), c.n_slots, c.page_slots};
  std::vector<float> probs(size_t(c.n_group) * c.n_slots), out(size_t(c.n_group) * c.head_dim), lse(c.n_group);
  cpu::attention_group(q.data(), c.n_group, c.head_dim, cpu_kv, c.max_pos, scale, probs.data(), out.data(),
                       lse.data());

  std::vector<DeviceBuffer<uint16_t>> d_key_pages, d_value_pages;
  std::vector<const uint16_t*> device_keys, device_values;
  for (int32_t p = 0; p < n_pages; ++p) {
    device_keys.push_back(d_key_pages.emplace_back(key_pages[p]).data());
    device_values.push_back(d_value_pages.emplace_back(value_pages[p]).data());
  }
  DeviceBuffer<const uint16_t*> d_keys(device_keys), d_values(device_values);
  DeviceBuffer<int32_t> d_positions(positions);
  DeviceBuffer<float> d_q(q), d_probs(probs.size()), d_out(out.size()), d_lse(lse.size());
  const KvPages kv{d_keys.data(), d_values.data(), d_positions.data(), c.n_slots, c.page_slots};
  attention_group(d_q.data(), c.n_group, c.head_dim, kv, c.max_pos, scale, d_probs.data(), d_out.data(),
                  d_lse.data(), nullptr);
  synchronize();

  expect_close(d_probs.to_host(), probs, 1e-6f, 1e-5f, "probs " + name);
  expect_close(d_out.to_host(), out, 2e-5f, 2e-5f, "out " + name);
  const auto got_lse = d_lse.to_host();
  for (int g = 0; g < c.n_group; ++g) {
    if (std::isinf(lse[g])) {
      EXPECT_TRUE(std::isinf(got_lse[g]) && got_lse[g] < 0) << "lse " << name;
    } else {
      EXPECT_NEAR(got_lse[g], lse[g], 2e-5f * (1.0f + std::fabs(lse[g]))) << "lse " << name;
    }
  }
}

TEST_F(CudaOpsTest, AttentionGroupMatchesCpu) {
  check_attention({4, 64, 70, 16, 69}, 11);     // last page partial, nothing masked
  check_attention({4, 64, 70, 16, 40}, 12);     // causal mask hides some slots
  check_attention({8, 128, 300, 32, 150}, 13);  // larger group and head
  check_attention({1, 96, 1, 16, 0}, 14);       // a single slot, head_dim not a multiple of 32
}

TEST_F(CudaOpsTest, AttentionFullyMaskedGivesZeros) {
  check_attention({2, 64, 20, 16, -1}, 15);
}

// Several units in one launch, over three heads' pages: prefixes of a head's
// slots (the causal mask of a prefill chunk), groups of different sizes, an
// empty prefix, and units of several tokens (each token one slot further,
// their queries a token stride apart, one token's split wholly masked). Each
// token against cpu::attention_group with positions equal to slot indices
// and max_pos at its prefix's end.
TEST_F(CudaOpsTest, AttentionUnitsMatchCpuPerUnit) {
  const int head_dim = 64, page_slots = 16, max_group = 6;
  const int32_t head_slots[3] = {70, 33, 600};  // 600: three splits of 256 slots, up to 19 of 32
  std::vector<std::vector<uint16_t>> pages;                    // host pages of both heads
  std::vector<std::vector<const uint16_t*>> host_keys(3), host_values(3);
  std::vector<DeviceBuffer<uint16_t>> d_pages;
  std::vector<const uint16_t*> table;                          // device: each head's keys, then its values
  size_t table_at[3] = {0, 0, 0};
  for (int h = 0; h < 3; ++h) {
    const int32_t n_pages = (head_slots[h] + page_slots - 1) / page_slots;
    std::vector<const uint16_t*> keys, values;
    for (int32_t p = 0; p < n_pages; ++p) {
      for (int kind = 0; kind < 2; ++kind) {
        const auto f = random_floats(size_t(page_slots) * head_dim, uint32_t(500 + 10 * h + 2 * p + kind));
        std::vector<uint16_t>& page = pages.emplace_back(f.size());
        cpu::to_f16(f.data(), page.data(), int64_t(f.size()));
        (kind == 0 ? host_keys : host_values)[size_t(h)].push_back(page.data());
        (kind == 0 ? keys : values).push_back(d_pages.emplace_back(page).data());
      }
    }
    table_at[h] = table.size();
    table.insert(table.end(), keys.begin(), keys.end());
    table.insert(table.end(), values.begin(), values.end());
  }
  DeviceBuffer<const uint16_t*> d_table(table);
  struct Case {
    int head, n_group;
    int32_t visible;  // the last token's
    int n_tokens = 1;
    int stride() const { return n_group / n_tokens * head_dim + (n_tokens > 1 ? 8 : 0); }  // floats per token
  };
  const std::vector<Case> cases{{0, 4, 70},  {0, 4, 41},  {1, 1, 33},     {1, 2, 1},      {0, 3, 0},
                                {1, 4, 17}, {2, 4, 600}, {2, 2, 257},    {2, 6, 600, 3}, {0, 4, 70, 4},
                                {2, 4, 257, 2}};
  std::vector<float> q_all, out_expected, probs_expected;  // out_expected: 0 between a unit's tokens
  std::vector<size_t> q_at, prob_at;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const int per_token = c.n_group / c.n_tokens;
    const auto q = random_floats(size_t(c.n_tokens) * size_t(c.stride()), uint32_t(600 + i));
    q_at.push_back(q_all.size());
    q_all.insert(q_all.end(), q.begin(), q.end());
    std::vector<int32_t> positions(static_cast<size_t>(head_slots[c.head]));
    for (size_t s = 0; s < positions.size(); ++s) positions[s] = int32_t(s);
    const cpu::KvPages kv{host_keys[size_t(c.head)].data(), host_values[size_t(c.head)].data(), positions.data(),
                          head_slots[c.head], page_slots};
    std::vector<float> probs(size_t(per_token) * size_t(head_slots[c.head]));
    std::vector<float> out(size_t(c.n_tokens) * size_t(c.stride()), 0.0f);
    prob_at.push_back(probs_expected.size());
    for (int t = 0; t < c.n_tokens; ++t) {
      const int32_t visible = c.visible - (c.n_tokens - 1 - t);
      cpu::attention_group(q.data() + t * c.stride(), per_token, head_dim, kv, visible - 1, 1.0f / 8.0f, probs.data(),
                           out.data() + t * c.stride(), nullptr);
      for (int g = 0; g < per_token; ++g) {  // the unit's prefix of each row (0 past the token's own)
        const float* row = probs.data() + size_t(g) * size_t(head_slots[c.head]);
        probs_expected.insert(probs_expected.end(), row, row + c.visible);
      }
    }
    out_expected.insert(out_expected.end(), out.begin(), out.end());
  }
  // The cases once (11 units: the smallest splits, 32 slots), 4 times (64),
  // 8 times (128) and 64 times (256): the split size follows the launch's
  // unit count.
  // Odd copies write no probabilities (null), as a pass without a policy.
  DeviceBuffer<float> d_q(q_all);
  for (const int copies : {1, 4, 8, 64}) {
    SCOPED_TRACE("copies " + std::to_string(copies));
    DeviceBuffer<float> d_out(std::vector<float>(copies * out_expected.size(), 0.0f));
    DeviceBuffer<float> d_probs(std::max<size_t>(copies * probs_expected.size(), 1));
    std::vector<AttentionUnit> units;
    for (int copy = 0; copy < copies; ++copy) {
      size_t out_at = copy * out_expected.size();
      for (size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        const size_t n_pages = (size_t(head_slots[c.head]) + page_slots - 1) / page_slots;
        float* probs = copy % 2 == 0 ? d_probs.data() + copy * probs_expected.size() + prob_at[i] : nullptr;
        units.push_back({d_q.data() + q_at[i], d_out.data() + out_at, probs, d_table.data() + table_at[c.head],
                         d_table.data() + table_at[c.head] + n_pages, c.visible, c.n_group, c.n_tokens, c.stride()});
        out_at += size_t(c.n_tokens) * size_t(c.stride());
      }
    }
    DeviceBuffer<AttentionUnit> d_units(units);
    const int32_t max_slots = 600;
    DeviceBuffer<float> d_scratch(attention_scratch_floats(int64_t(units.size()), max_group, head_dim, max_slots));
    attention_units(d_units.data(), int64_t(units.size()), max_group, head_dim, page_slots, 1.0f / 8.0f, max_slots,
                    d_scratch.data(), nullptr);
    synchronize();
    const auto out = d_out.to_host();
    const auto probs = d_probs.to_host();
    for (int copy = 0; copy < copies; ++copy) {
      const auto out_begin = out.begin() + copy * out_expected.size();
      expect_close(std::vector<float>(out_begin, out_begin + out_expected.size()), out_expected, 2e-5f, 2e-5f, "out");
      if (copy % 2 == 1) continue;
      const auto probs_begin = probs.begin() + copy * probs_expected.size();
      expect_close(std::vector<float>(probs_begin, probs_begin + probs_expected.size()), probs_expected, 1e-6f, 1e-5f,
                   "probs");
    }
  }
}

// A prefill chunk on the tensor cores: 1100 tokens after 100 cached slots
// (two blocks of queries, the second over more slots), two queries per
// token, rows a stride apart; each token against cpu::attention_group over
// its own prefix. f16 queries and probabilities (10 mantissa bits) leave
// about 1e-3 of each output: 3e-3 absolute and relative.
TEST_F(CudaOpsTest, PrefillAttentionMatchesCpuPerToken) {
  const int head_dim = 64, page_slots = 16, n_group = 2;
  const int64_t n_tokens = 1100, stride = n_group * head_dim + 16;
  const int32_t n_slots = 1200;
  const int32_t n_pages = (n_slots + page_slots - 1) / page_slots;
  std::vector<std::vector<uint16_t>> pages;
  std::vector<const uint16_t*> host_keys, host_values, table;
  std::vector<DeviceBuffer<uint16_t>> d_pages;
  for (int kind = 0; kind < 2; ++kind) {
    for (int32_t p = 0; p < n_pages; ++p) {
      const auto f = random_floats(size_t(page_slots) * head_dim, uint32_t(900 + 2 * p + kind));
      std::vector<uint16_t>& page = pages.emplace_back(f.size());
      cpu::to_f16(f.data(), page.data(), int64_t(f.size()));
      (kind == 0 ? host_keys : host_values).push_back(page.data());
      table.push_back(d_pages.emplace_back(page).data());  // keys, then values
    }
  }
  const auto q = random_floats(size_t(n_tokens * stride), 950);
  std::vector<int32_t> positions(static_cast<size_t>(n_slots));
  for (size_t s = 0; s < positions.size(); ++s) positions[s] = int32_t(s);
  const cpu::KvPages kv{host_keys.data(), host_values.data(), positions.data(), n_slots, page_slots};
  const float scale = 1.0f / 8.0f;
  std::vector<float> expected(q.size(), 0.0f), probs(size_t(n_group) * n_slots);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int32_t visible = n_slots - int32_t(n_tokens - 1 - t);
    cpu::attention_group(&q[size_t(t * stride)], n_group, head_dim, kv, visible - 1, scale, probs.data(),
                         &expected[size_t(t * stride)], nullptr);
  }
  DeviceBuffer<const uint16_t*> d_table(table);
  DeviceBuffer<float> d_q(q), d_out(std::vector<float>(q.size(), 0.0f));
  PrefillAttention attention(nullptr);
  attention.reserve(n_tokens, n_slots, n_group, head_dim);
  attention.run(d_q.data(), stride, d_table.data(), d_table.data() + n_pages, page_slots, n_slots, n_tokens, n_group,
                head_dim, scale, d_out.data(), stride);
  expect_close(d_out.to_host(), expected, 3e-3f, 3e-3f, "prefill attention");
  expect_invalid([&] {  // more tokens than reserved
    attention.run(d_q.data(), stride, d_table.data(), d_table.data() + n_pages, page_slots, n_slots + 4000,
                  n_tokens + 4000, n_group, head_dim, scale, d_out.data(), stride);
  });
}

TEST_F(CudaOpsTest, AddRowsScatterPagesAndScatterKvRows) {
  const auto x = random_floats(5 * 24, 31), bias = random_floats(24, 32);
  DeviceBuffer<float> d_x(x), d_bias(bias);
  add_rows(d_x.data(), d_bias.data(), 5, 24, nullptr);
  std::vector<float> expected = x;
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += bias[i % 24];
  EXPECT_EQ(d_x.to_host(), expected);

  // Three staged pages of 48 bytes into a pool of five, out of order.
  const int64_t page_bytes = 48;
  std::vector<uint8_t> staged(3 * page_bytes);
  for (size_t i = 0; i < staged.size(); ++i) staged[i] = uint8_t(i * 7 + 1);
  DeviceBuffer<uint8_t> pool(std::vector<uint8_t>(5 * page_bytes, 0)), d_staged(staged);
  const std::vector<uint8_t*> destinations{pool.data() + 4 * page_bytes, pool.data(), pool.data() + 2 * page_bytes};
  DeviceBuffer<uint8_t*> d_destinations(destinations);
  scatter_pages(d_staged.data(), d_destinations.data(), 3, page_bytes, nullptr);
  synchronize();
  const auto got = pool.to_host();
  const int order[5] = {1, -1, 2, -1, 0};  // which staged page each pool page holds
  for (int p = 0; p < 5; ++p) {
    for (int64_t b = 0; b < page_bytes; ++b) {
      const uint8_t want = order[p] < 0 ? 0 : staged[size_t(order[p] * page_bytes + b)];
      ASSERT_EQ(got[size_t(p * page_bytes + b)], want) << "page " << p << " byte " << b;
    }
  }

  // Three new K/V rows into two pages of 4 slots (head_dim 8): keys become
  // columns of their page's transposed block, values rows; the rest untouched.
  const int head_dim = 8, page_slots = 4;
  std::vector<uint16_t> k16(3 * head_dim), v16(3 * head_dim);
  for (size_t i = 0; i < k16.size(); ++i) {
    k16[i] = uint16_t(100 + i);
    v16[i] = uint16_t(500 + i);
  }
  const size_t block = size_t(head_dim) * page_slots;  // halves of a page's keys (then as many values)
  DeviceBuffer<uint16_t> kv_pool(std::vector<uint16_t>(4 * block, 0)), d_k16(k16), d_v16(v16);
  uint16_t* page0 = kv_pool.data();
  uint16_t* page1 = kv_pool.data() + 2 * block;
  const std::vector<KvRowTarget> targets{{page1, page1 + block, 3, 0}, {page0, page0 + block, 1, 2},
                                         {page1, page1 + block, 0, 1}};
  DeviceBuffer<KvRowTarget> d_targets(targets);
  scatter_kv_rows(d_k16.data(), d_v16.data(), d_targets.data(), 3, head_dim, page_slots, nullptr);
  synchronize();
  std::vector<uint16_t> want(4 * block, 0);
  const size_t page_at[2] = {0, 2 * block};
  const int target_page[3] = {1, 0, 1};
  for (size_t t = 0; t < targets.size(); ++t) {
    const size_t base = page_at[target_page[t]];
    for (int d = 0; d < head_dim; ++d) {
      const size_t source = size_t(targets[t].row * head_dim + d);
      want[base + size_t(d) * page_slots + size_t(targets[t].in_page)] = k16[source];
      want[base + block + size_t(targets[t].in_page) * head_dim + size_t(d)] = v16[source];
    }
  }
  EXPECT_EQ(kv_pool.to_host(), want);
}

// ---- no device needed -------------------------------------------------------------------

TEST(CudaCheck, ThrowsInternalErrorNamingTheCall) {
  try {
    LAZYKV_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    const std::string message = e.what();
    EXPECT_NE(message.find("cuda_ops_test.cc"), std::string::npos) << message;
    EXPECT_NE(message.find("cudaErrorInvalidValue"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(LAZYKV_CUDA_CHECK(cudaSuccess));
  // A failed allocation is out of memory (the worker preempts and retries).
  try {
    LAZYKV_CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
  }
}

TEST(CudaOps, RejectsUnsupportedArgumentsBeforeLaunching) {
  EXPECT_FALSE(dequantize_supported(DType::kQ8_K));
  EXPECT_FALSE(matmul_supported(DType::kQ4_K));
  float dummy = 0.0f;
  expect_invalid([&] { dequantize_rows(DType::kQ8_K, &dummy, &dummy, 1, 256, nullptr); });
  expect_invalid([&] { dequantize_rows(DType::kQ4_0, &dummy, &dummy, 1, 33, nullptr); });
  expect_invalid([&] { matmul(WeightMatrix{DType::kQ4_K, 1, 256, &dummy}, &dummy, 1, &dummy, nullptr); });
  expect_invalid([&] { rope(&dummy, nullptr, nullptr, 1, 1, 4, 3, 1.0f, RopeStyle::kNeox, nullptr); });
  alignas(16) uint8_t page[64] = {};
  expect_invalid([&] { scatter_pages(page, nullptr, 1, 40, nullptr); });  // not whole 16-byte words
  expect_invalid([&] { attention_units(nullptr, 1, 256, 128, 16, 1.0f, 1, nullptr, nullptr); });  // q over shared memory
  expect_invalid([&] { attention_units(nullptr, 1, 4, 66, 16, 1.0f, 1, nullptr, nullptr); });  // 8-byte value loads
  expect_invalid([&] { attention_units(nullptr, 1, 4, 64, 15, 1.0f, 1, nullptr, nullptr); });  // slot pairs in a page
}

TEST(DeviceBuffer, EmptyBufferNeedsNoDevice) {
  DeviceBuffer<float> empty;
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_TRUE(empty.to_host().empty());
  DeviceBuffer<float> moved(std::move(empty));
  EXPECT_EQ(moved.bytes(), 0u);
}

}  // namespace
}  // namespace lazykv::cuda
