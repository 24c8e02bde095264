// Block formats: known values (GGML layouts), quantize/dequantize round
// trips, activation rounding, and the dot products (SIMD vs scalar vs float).
#include "kernels/cpu/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/quant_internal.h"
#include "kernel_test_util.h"

namespace lazykv::cpu {
namespace {

using testing::dequantize;
using testing::quantize;
using testing::random_floats;

std::string name(DType t) { return std::string(dtype_traits(t).name); }

// --- fp16 / bf16 rows -------------------------------------------------------------

TEST(QuantF16, SpecialValuesDecode) {
  const uint16_t bits[] = {0x0000, 0x8000, 0x3C00, 0xC000, 0x7C00, 0xFC00, 0x0001, 0x03FF, 0x7BFF, 0x7E00};
  float out[10];
  dequantize_row(DType::kF16, bits, out, 10);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_TRUE(std::signbit(out[1]) && out[1] == 0.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], -2.0f);
  EXPECT_EQ(out[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[5], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[6], std::ldexp(1.0f, -24));              // smallest subnormal
  EXPECT_EQ(out[7], std::ldexp(1023.0f, -24));           // largest subnormal
  EXPECT_EQ(out[8], 65504.0f);                           // largest finite
  EXPECT_TRUE(std::isnan(out[9]));
}

TEST(QuantF16, SpecialValuesEncode) {
  const float in[] = {0.0f, -0.0f, 1.0f, 65504.0f, 1e6f, -1e6f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -26),
                      std::numeric_limits<float>::quiet_NaN(), 1.0f + std::ldexp(1.0f, -11)};
  uint16_t bits[10];
  quantize_row(DType::kF16, in, bits, 10);
  EXPECT_EQ(bits[0], 0x0000);
  EXPECT_EQ(bits[1], 0x8000);
  EXPECT_EQ(bits[2], 0x3C00);
  EXPECT_EQ(bits[3], 0x7BFF);
  EXPECT_EQ(bits[4], 0x7C00);  // overflow -> inf
  EXPECT_EQ(bits[5], 0xFC00);
  EXPECT_EQ(bits[6], 0x0001);
  EXPECT_EQ(bits[7], 0x0000);  // underflow to zero
  EXPECT_EQ(bits[8] & 0x7C00, 0x7C00);
  EXPECT_NE(bits[8] & 0x03FF, 0);  // still NaN
  EXPECT_EQ(bits[9], 0x3C00);      // exact tie rounds to even
}

TEST(QuantBF16, RoundTripAndRounding) {
  const float in[] = {1.0f, -3.5f, 1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(3.0f, -9)};
  uint16_t bits[4];
  quantize_row(DType::kBF16, in, bits, 4);
  EXPECT_EQ(bits[0], 0x3F80);
  EXPECT_EQ(bits[1], 0xC060);
  EXPECT_EQ(bits[2], 0x3F80);  // tie to even
  EXPECT_EQ(bits[3], 0x3F81);  // above the tie rounds up
  float out[4];
  dequantize_row(DType::kBF16, bits, out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.5f);
}

// --- known block values ----------------------------------------------------------------

TEST(QuantKnown, Q4_0) {
  BlockQ4_0 b{};
  b.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::kQ4_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * static_cast<float>(j - 8)) << j;            // low nibbles: elements 0..15
    EXPECT_EQ(y[j + 16], 0.5f * static_cast<float>(7 - j)) << j + 16;  // high nibbles: 16..31
  }
}

TEST(QuantKnown, Q4_1) {
  BlockQ4_1 b{};
  b.d = fp32_to_fp16(0.25f);
  b.m = fp32_to_fp16(-1.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::kQ4_1, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * static_cast<float>(j) - 1.0f);
    EXPECT_EQ(y[j + 16], 0.25f * static_cast<float>(15 - j) - 1.0f);
  }
}

TEST(QuantKnown, Q8_0AndQ8_1) {
  BlockQ8_0 a{};
  BlockQ8_1 b{};
  a.d = b.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 32; ++j) a.qs[j] = b.qs[j] = static_cast<int8_t>(4 * j - 64);
  float ya[32], yb[32];
  dequantize_row(DType::kQ8_0, &a, ya, 32);
  dequantize_row(DType::kQ8_1, &b, yb, 32);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(ya[j], 0.5f * static_cast<float>(4 * j - 64));
    EXPECT_EQ(yb[j], ya[j]);
  }
}

TEST(QuantKnown, Q8_K) {
  BlockQ8_K b{};
  b.d = 0.125f;
  for (int j = 0; j < 256; ++j) b.qs[j] = static_cast<int8_t>(j % 255 - 127);
  std::vector<float> y(256);
  dequantize_row(DType::kQ8_K, &b, y.data(), 256);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], 0.125f * static_cast<float>(j % 255 - 127));
}

TEST(QuantKnown, Q4_K) {
  // Scales/mins with values above 15 so the 2 high bits of sub-blocks 4..7
  // (stored in the top bits of bytes 0..7) matter.
  const int sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
  const int mn[8] = {0, 5, 10, 20, 30, 40, 62, 63};
  BlockQ4_K b{};
  b.d = fp32_to_fp16(0.5f);
  b.dmin = fp32_to_fp16(0.25f);
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>((i * 7 + 3) & 0xFF);
  for (int j = 0; j < 8; ++j) {
    int s, m;
    q4k_scale_min(j, b.scales, s, m);
    EXPECT_EQ(s, sc[j]) << j;
    EXPECT_EQ(m, mn[j]) << j;
  }
  std::vector<float> y(256);
  dequantize_row(DType::kQ4_K, &b, y.data(), 256);
  for (int e = 0; e < 256; ++e) {
    // 4 groups of 64: the group's 32 bytes give elements 0..31 (low nibbles)
    // then 32..63 (high nibbles); sub-block = e / 32.
    const int group = e / 64, l = e % 64;
    const uint8_t byte = b.qs[32 * group + l % 32];
    const int q = l < 32 ? (byte & 15) : (byte >> 4);
    const float expected = 0.5f * static_cast<float>(sc[e / 32] * q) - 0.25f * static_cast<float>(mn[e / 32]);
    EXPECT_FLOAT_EQ(y[e], expected) << e;
  }
}

TEST(QuantKnown, Q6_K) {
  BlockQ6_K b{};
  b.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(j - 8);
  // Only the first bytes are set: everything else decodes to q = 0 - 32.
  b.ql[0] = 0x21;        // element 0: low 4 = 1; element 64: low 4 = 2
  b.ql[32] = 0x43;       // element 32: 3; element 96: 4
  b.qh[0] = 0xE4;        // 2-bit highs: element 0: 0, 32: 1, 64: 2, 96: 3
  b.ql[64] = 0x0F;       // second half, element 128: low 4 = 15
  b.qh[32] = 0x03;       // element 128: high 2 = 3 -> q = 63
  std::vector<float> y(256);
  dequantize_row(DType::kQ6_K, &b, y.data(), 256);
  auto expect = [&](int e, int q, int scale_index) {
    EXPECT_FLOAT_EQ(y[e], 0.5f * static_cast<float>(b.scales[scale_index]) * static_cast<float>(q - 32)) << e;
  };
  expect(0, 1, 0);
  expect(32, 16 + 3, 2);
  expect(64, 32 + 2, 4);
  expect(96, 48 + 4, 6);
  expect(128, 63, 8);
  expect(1, 0, 0);
  expect(16, 0, 1);    // second sub-block of 16 uses the next scale
  expect(255, 0, 15);
}

// --- activation quantizers follow GGML's rounding ----------------------------------------

TEST(QuantActivations, Q8_0RoundsHalfAwayFromZero) {
  float x[32] = {};
  x[0] = 127.0f;  // amax 127 -> d = 1
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49f;
  x[4] = -126.6f;
  BlockQ8_0 b;
  quantize_row(DType::kQ8_0, x, &b, 32);
  EXPECT_EQ(fp16_to_fp32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 3);
  EXPECT_EQ(b.qs[2], -3);
  EXPECT_EQ(b.qs[3], 0);
  EXPECT_EQ(b.qs[4], -127);
}

TEST(QuantActivations, ZeroBlockIsZero) {
  std::vector<float> x(256, 0.0f);
  for (DType t : {DType::kQ8_0, DType::kQ8_1, DType::kQ8_K, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K, DType::kQ6_K}) {
    const auto y = dequantize(t, quantize(t, x), x.size());
    for (float v : y) ASSERT_EQ(v, 0.0f) << name(t);
  }
}

TEST(QuantActivations, Q8_1SumField) {
  const auto x = random_floats(32 * 20, 7);
  std::vector<BlockQ8_1> blocks(20);
  quantize_row(DType::kQ8_1, x.data(), blocks.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    int sum = 0;
    float amax = 0.0f, xsum = 0.0f;
    for (int j = 0; j < 32; ++j) {
      sum += blocks[i].qs[j];
      amax = std::max(amax, std::fabs(x[32 * i + j]));
      xsum += x[32 * i + j];
    }
    const float d = amax / 127.0f;
    EXPECT_EQ(blocks[i].s, fp32_to_fp16(d * static_cast<float>(sum))) << i;  // unrounded d, as GGML
    EXPECT_EQ(blocks[i].d, fp32_to_fp16(d));
    EXPECT_NEAR(fp16_to_fp32(blocks[i].s), xsum, 32 * d * 0.5f + 0.01f);
  }
}

TEST(QuantActivations, Q8_KScaleSumsAndRounding) {
  std::vector<float> x(256, 0.0f);
  x[0] = -127.0f;  // the largest magnitude is negative -> iscale = 1, d = 1
  x[1] = 2.5f;     // round half to even -> 2
  x[2] = 3.5f;     // -> 4
  x[3] = 100.2f;
  BlockQ8_K b;
  quantize_row(DType::kQ8_K, x.data(), &b, 256);
  EXPECT_EQ(b.d, 1.0f);
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[1], 2);
  EXPECT_EQ(b.qs[2], 4);
  EXPECT_EQ(b.qs[3], 100);
  EXPECT_EQ(b.bsums[0], -127 + 2 + 4 + 100);
  EXPECT_EQ(b.bsums[1], 0);

  const auto r = random_floats(1024, 9);
  std::vector<BlockQ8_K> blocks(4);
  quantize_row(DType::kQ8_K, r.data(), blocks.data(), 1024);
  for (const auto& blk : blocks) {
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += blk.qs[16 * g + j];
      EXPECT_EQ(blk.bsums[g], sum);
    }
  }
}

// --- round trips ------------------------------------------------------------------------------

struct RoundTripCase {
  DType type;
  double max_rms_ratio;  // rms(error) / rms(x) on N(0,1) data
};

class QuantRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(QuantRoundTrip, DequantizeOfQuantizeIsClose) {
  const RoundTripCase c = GetParam();
  const size_t n = 256 * 12;
  const auto x = random_floats(n, 42);
  const auto y = dequantize(c.type, quantize(c.type, x), n);
  double err2 = 0.0, x2 = 0.0;
  for (size_t i = 0; i < n; ++i) {
    err2 += (y[i] - x[i]) * (y[i] - x[i]);
    x2 += x[i] * x[i];
  }
  EXPECT_LT(std::sqrt(err2 / x2), c.max_rms_ratio) << name(c.type);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantRoundTrip,
                         ::testing::Values(RoundTripCase{DType::kF32, 1e-9}, RoundTripCase{DType::kF16, 1e-3},
                                           RoundTripCase{DType::kBF16, 5e-3}, RoundTripCase{DType::kQ8_0, 0.01},
                                           RoundTripCase{DType::kQ8_1, 0.01}, RoundTripCase{DType::kQ8_K, 0.01},
                                           RoundTripCase{DType::kQ4_0, 0.15}, RoundTripCase{DType::kQ4_1, 0.12},
                                           RoundTripCase{DType::kQ4_K, 0.15}, RoundTripCase{DType::kQ6_K, 0.04}),
                         [](const auto& info) { return name(info.param.type); });

TEST(QuantRoundTrip, PerElementBoundsForLegacyFormats) {
  const size_t n = 32 * 40;
  const auto x = random_floats(n, 3, 2.0f);
  const auto q4_0 = dequantize(DType::kQ4_0, quantize(DType::kQ4_0, x), n);
  const auto q4_1 = dequantize(DType::kQ4_1, quantize(DType::kQ4_1, x), n);
  const auto q8_0 = dequantize(DType::kQ8_0, quantize(DType::kQ8_0, x), n);
  for (size_t b = 0; b < n / 32; ++b) {
    float lo = x[32 * b], hi = x[32 * b], amax = 0.0f;
    for (size_t j = 32 * b; j < 32 * b + 32; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
      amax = std::max(amax, std::fabs(x[j]));
    }
    for (size_t j = 32 * b; j < 32 * b + 32; ++j) {
      EXPECT_LE(std::fabs(q8_0[j] - x[j]), amax / 127.0f * 0.5f + amax * 1e-3f) << j;
      EXPECT_LE(std::fabs(q4_1[j] - x[j]), (hi - lo) / 15.0f * 0.5f + (hi - lo) * 2e-3f) << j;
      EXPECT_LE(std::fabs(q4_0[j] - x[j]), amax / 8.0f * 1.01f) << j;  // one side clamps at q = 15
    }
  }
}

TEST(QuantErrors, RejectsPartialBlocks) {
  std::vector<float> x(48);
  std::vector<uint8_t> out(64);
  EXPECT_THROW(quantize_row(DType::kQ8_0, x.data(), out.data(), 48), Error);
  EXPECT_THROW(dequantize_row(DType::kQ4_1, out.data(), x.data(), 40), Error);
}

TEST(QuantDot, VecDotTypes) {
  EXPECT_EQ(vec_dot_type(DType::kQ4_0), DType::kQ8_0);
  EXPECT_EQ(vec_dot_type(DType::kQ8_0), DType::kQ8_0);
  EXPECT_EQ(vec_dot_type(DType::kQ4_1), DType::kQ8_1);
  EXPECT_EQ(vec_dot_type(DType::kQ4_K), DType::kQ8_K);
  EXPECT_EQ(vec_dot_type(DType::kQ6_K), DType::kQ8_K);
  EXPECT_EQ(vec_dot_type(DType::kF32), DType::kF32);
  EXPECT_EQ(vec_dot_type(DType::kF16), DType::kF32);
  EXPECT_EQ(vec_dot_type(DType::kBF16), DType::kF32);
  EXPECT_THROW(vec_dot_type(DType::kQ8_K), Error);
}

// --- dot products -----------------------------------------------------------------------------

struct DotInputs {
  std::vector<uint8_t> w, a;       // weight row, activation row in vec_dot_type
  std::vector<float> w_f, a_f;     // their dequantized values
  std::vector<float> x;            // the activations before quantization
};

DotInputs make_dot_inputs(DType type, size_t n, uint32_t seed) {
  DotInputs in;
  in.x = random_floats(n, seed + 1);
  in.w = quantize(type, random_floats(n, seed, 0.5f));
  in.w_f = dequantize(type, in.w, n);
  in.a = quantize(vec_dot_type(type), in.x);
  in.a_f = dequantize(vec_dot_type(type), in.a, n);
  return in;
}

std::vector<size_t> dot_lengths(DType t) {
  if (testing::is_k_quant(t)) return {256, 512, 1536, 2816};
  if (t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ8_0) return {32, 64, 96, 576, 1536, 4128};
  return {1, 7, 16, 33, 100, 576, 1537};
}

class QuantDot : public ::testing::TestWithParam<DType> {};

TEST_P(QuantDot, SimdMatchesScalar) {
  const DType t = GetParam();
  uint32_t seed = 100;
  for (size_t n : dot_lengths(t)) {
    const auto in = make_dot_inputs(t, n, seed++);
    const int64_t len = static_cast<int64_t>(n);
    const float simd = vec_dot(t, len, in.w.data(), in.a.data());
    const float scalar = vec_dot_scalar(t, len, in.w.data(), in.a.data());
    double magnitude = 0.0;
    for (size_t i = 0; i < n; ++i) magnitude += std::fabs(static_cast<double>(in.w_f[i]) * in.a_f[i]);
    EXPECT_NEAR(simd, scalar, 2e-6 * magnitude + 1e-6) << name(t) << " n=" << n;
  }
}

TEST_P(QuantDot, ScalarMatchesDequantizedDot) {
  const DType t = GetParam();
  uint32_t seed = 200;
  for (size_t n : dot_lengths(t)) {
    const auto in = make_dot_inputs(t, n, seed++);
    const float got = vec_dot_scalar(t, static_cast<int64_t>(n), in.w.data(), in.a.data());
    // Against the dequantized activations: only float rounding differs, plus
    // Q4_1's fp16-rounded s = d*sum(q) per block.
    double exact = 0.0, magnitude = 0.0, s_rounding = 0.0;
    for (size_t i = 0; i < n; ++i) {
      exact += static_cast<double>(in.w_f[i]) * in.a_f[i];
      magnitude += std::fabs(static_cast<double>(in.w_f[i]) * in.a_f[i]);
    }
    if (t == DType::kQ4_1) {
      const auto* wb = reinterpret_cast<const BlockQ4_1*>(in.w.data());
      const auto* ab = reinterpret_cast<const BlockQ8_1*>(in.a.data());
      for (size_t b = 0; b < n / 32; ++b) {
        s_rounding += std::fabs(fp16_to_fp32(wb[b].m) * fp16_to_fp32(ab[b].s)) * std::ldexp(1.0, -11);
      }
    }
    EXPECT_NEAR(got, exact, 1e-5 * magnitude + s_rounding + 1e-6) << name(t) << " n=" << n;

    // Against the float activations: the activation quantization error bounds the gap.
    double reference = 0.0, bound = 0.0;
    for (size_t i = 0; i < n; ++i) {
      reference += static_cast<double>(in.w_f[i]) * in.x[i];
      bound += std::fabs(static_cast<double>(in.w_f[i]) * (in.x[i] - in.a_f[i]));
    }
    EXPECT_NEAR(got, reference, bound + 1e-5 * magnitude + s_rounding + 1e-6) << name(t) << " n=" << n;
  }
}

TEST_P(QuantDot, ExtremeBlocksDoNotOverflow) {
  // Largest-magnitude quants everywhere: checks the integer paths (e.g. a
  // saturating 16-bit multiply-add) against the scalar reference.
  const DType t = GetParam();
  const size_t n = testing::is_k_quant(t) ? 512 : 128;
  std::vector<float> w(n), x(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = (i % 3 == 0) ? -1.0f : 1.0f;
    x[i] = (i % 2 == 0) ? -1.0f : 1.0f;
  }
  const auto wq = quantize(t, w);
  const auto xq = quantize(vec_dot_type(t), x);
  const float simd = vec_dot(t, static_cast<int64_t>(n), wq.data(), xq.data());
  const float scalar = vec_dot_scalar(t, static_cast<int64_t>(n), wq.data(), xq.data());
  EXPECT_NEAR(simd, scalar, 1e-4 * static_cast<double>(n)) << name(t);
}

// Every tile shape against one-pair dots: the K-quant tiles sum each (row,
// token) pair exactly as vec_dot does (bit for bit); the 32-element formats'
// multi-token tiles scale block by block instead of 8 blocks at a time, so
// they agree to rounding.
void check_tile_shapes(DType t) {
  const bool k_quant = testing::is_k_quant(t);
  const int64_t n = k_quant ? 512 : 96;
  const DType act = vec_dot_type(t);
  const size_t w_bytes = row_bytes(t, size_t(n)), a_bytes = row_bytes(act, size_t(n));
  std::vector<uint8_t> w, a;
  for (int r = 0; r < simd::kTileRows; ++r) {
    const auto row = testing::quantize(t, testing::random_floats(size_t(n), 300 + uint32_t(r), 0.3f));
    w.insert(w.end(), row.begin(), row.end());
  }
  for (int k = 0; k < simd::kTileTokens; ++k) {
    const auto row = testing::quantize(act, testing::random_floats(size_t(n), 400 + uint32_t(k)));
    a.insert(a.end(), row.begin(), row.end());
  }
  for (int rows = 1; rows <= simd::kTileRows; ++rows) {
    for (int tokens = 1; tokens <= simd::kTileTokens; ++tokens) {
      std::vector<float> y(size_t(rows * tokens), std::nanf(""));
      simd::dot_tile(t, n, w.data(), w_bytes, rows, a.data(), a_bytes, tokens, y.data(), size_t(rows));
      for (int k = 0; k < tokens; ++k) {
        for (int r = 0; r < rows; ++r) {
          const float pair = vec_dot(t, n, w.data() + size_t(r) * w_bytes, a.data() + size_t(k) * a_bytes);
          const float got = y[size_t(k * rows + r)];
          if (k_quant) {
            EXPECT_EQ(got, pair) << name(t) << " tile " << rows << "x" << tokens << " row " << r << " token " << k;
          } else {
            EXPECT_NEAR(got, pair, 1e-5f * std::fabs(pair) + 1e-4f)
                << name(t) << " tile " << rows << "x" << tokens << " row " << r << " token " << k;
          }
        }
      }
    }
  }
}

TEST(QuantDot, EveryTileShapeMatchesVecDot) {
  int tiled = 0;
  for (DType t : testing::weight_types()) {
    if (!simd::has_dot_tile(t)) continue;
    check_tile_shapes(t);
    ++tiled;
  }
  if (tiled == 0) GTEST_SKIP() << "this build has no SIMD tiles";
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, QuantDot, ::testing::ValuesIn(testing::weight_types()),
                         [](const auto& info) { return name(info.param); });

}  // namespace
}  // namespace lazykv::cpu
