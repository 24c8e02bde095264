// Shared helpers for the CPU kernel tests: random data and row conversions
// into owned buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/quant.h"

namespace lazykv::cpu::testing {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<uint8_t> quantize(DType type, const std::vector<float>& x) {
  std::vector<uint8_t> out(row_bytes(type, x.size()));
  quantize_row(type, x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

inline std::vector<float> dequantize(DType type, const std::vector<uint8_t>& q, size_t n) {
  std::vector<float> out(n);
  dequantize_row(type, q.data(), out.data(), static_cast<int64_t>(n));
  return out;
}

inline const std::vector<DType>& weight_types() {
  static const std::vector<DType> types = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0,
                                           DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};
  return types;
}

// A weight row's dot with an activation row in double precision, and
// Σ|w·x|, which bounds what f32 rounding may add to it.
struct ReferenceDot {
  double dot = 0.0, magnitude = 0.0;
};
inline ReferenceDot reference_dot(const float* w, const float* x, int64_t n) {
  ReferenceDot r;
  for (int64_t k = 0; k < n; ++k) {
    r.dot += double(w[k]) * x[k];
    r.magnitude += std::fabs(double(w[k]) * x[k]);
  }
  return r;
}

inline bool is_k_quant(DType t) { return t == DType::kQ4_K || t == DType::kQ6_K; }

}  // namespace lazykv::cpu::testing
