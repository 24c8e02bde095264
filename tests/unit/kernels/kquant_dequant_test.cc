// dequantize_row for the K-quants (SIMD where built) against the element
// formulas of the GGML formats, bit for bit, on random blocks.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "kernels/cpu/quant.h"

namespace lazykv::cpu {
namespace {

std::vector<uint8_t> random_blocks(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> data(bytes);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  return data;
}

TEST(KQuantDequant, Q4KMatchesTheFormula) {
  const int nb = 7;
  auto data = random_blocks(sizeof(BlockQ4_K) * nb, 1);
  auto* blocks = reinterpret_cast<BlockQ4_K*>(data.data());
  for (int i = 0; i < nb; ++i) {  // finite scales
    blocks[i].d = fp32_to_fp16(0.01f * float(i + 1));
    blocks[i].dmin = fp32_to_fp16(0.003f * float(i + 2));
  }
  std::vector<float> y(size_t(nb) * 256);
  dequantize_row(DType::kQ4_K, data.data(), y.data(), nb * 256);
  for (int i = 0; i < nb; ++i) {
    const BlockQ4_K& b = blocks[i];
    for (int e = 0; e < 256; ++e) {
      const int group = e / 64, j = 2 * group + (e % 64) / 32, l = e % 32;
      int sc, m;
      if (j < 4) {
        sc = b.scales[j] & 63;
        m = b.scales[j + 4] & 63;
      } else {
        sc = (b.scales[j + 4] & 0x0F) | ((b.scales[j - 4] >> 6) << 4);
        m = (b.scales[j + 4] >> 4) | ((b.scales[j] >> 6) << 4);
      }
      const uint8_t byte = b.qs[32 * group + l];
      const int q = (e % 64) < 32 ? (byte & 0x0F) : (byte >> 4);
      const float expected = fp16_to_fp32(b.d) * float(sc) * float(q) - fp16_to_fp32(b.dmin) * float(m);
      ASSERT_EQ(y[size_t(i) * 256 + size_t(e)], expected) << "block " << i << " element " << e;
    }
  }
}

TEST(KQuantDequant, Q6KMatchesTheFormula) {
  const int nb = 5;
  auto data = random_blocks(sizeof(BlockQ6_K) * nb, 2);
  auto* blocks = reinterpret_cast<BlockQ6_K*>(data.data());
  for (int i = 0; i < nb; ++i) blocks[i].d = fp32_to_fp16(0.02f * float(i + 1));
  std::vector<float> y(size_t(nb) * 256);
  dequantize_row(DType::kQ6_K, data.data(), y.data(), nb * 256);
  for (int i = 0; i < nb; ++i) {
    const BlockQ6_K& b = blocks[i];
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, l = e % 128, quarter = l / 32, k = l % 32;
      const uint8_t low = b.ql[64 * half + (quarter & 1 ? 32 : 0) + k];
      const int low4 = quarter < 2 ? (low & 0x0F) : (low >> 4);
      const int high2 = (b.qh[32 * half + k] >> (2 * quarter)) & 3;
      const int q = (low4 | (high2 << 4)) - 32;
      const int sub = 8 * half + 2 * quarter + k / 16;
      const float expected = fp16_to_fp32(b.d) * float(b.scales[sub]) * float(q);
      ASSERT_EQ(y[size_t(i) * 256 + size_t(e)], expected) << "block " << i << " element " << e;
    }
  }
}

}  // namespace
}  // namespace lazykv::cpu
