// Retention gates of random weights for a model shape (trimkv tests): what
// scripts/train_trimkv.py writes, with weights drawn instead of trained.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "worker/format/safetensors.h"

namespace lazykv {

struct RandomGatesSpec {
  int n_layer = 2, n_embd = 64, n_head_kv = 2, n_hidden = 16;
  DType weights = DType::kF16;  // w1 and w2: F16, BF16 or F32; biases are F32
  float bias = 2.0f;            // the mean of the per-head bias (10 at the start of training)
  uint32_t seed = 1;
};

// The tensors (their bytes live in `storage`, which must outlive them).
inline std::vector<SafetensorsTensor> random_gate_tensors(const RandomGatesSpec& spec,
                                                          std::vector<std::vector<uint8_t>>& storage) {
  std::mt19937 rng(spec.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<SafetensorsTensor> tensors;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, DType type, float scale, float mean) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint8_t>& bytes = storage.emplace_back(size_t(n) * (type == DType::kF32 ? 4 : 2));
    for (int64_t i = 0; i < n; ++i) {
      const float v = mean + scale * normal(rng);
      if (type == DType::kF32) {
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = type == DType::kF16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    tensors.push_back({name, type, std::move(shape), bytes.data(), bytes.size()});
  };
  for (int l = 0; l < spec.n_layer; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "w1", {spec.n_hidden, spec.n_embd}, spec.weights, 0.3f, 0.0f);
    add(p + "b1", {spec.n_hidden}, DType::kF32, 0.1f, 0.0f);
    add(p + "w2", {spec.n_head_kv, spec.n_hidden}, spec.weights, 0.5f, 0.0f);
    add(p + "bias", {spec.n_head_kv}, DType::kF32, 1.0f, spec.bias);
  }
  return tensors;
}

inline void write_random_gates(const std::string& path, const RandomGatesSpec& spec) {
  std::vector<std::vector<uint8_t>> storage;
  write_safetensors(path, random_gate_tensors(spec, storage));
}

}  // namespace lazykv
