// Token sampling: greedy, or temperature with top-k, top-p and min-p
// filtering (applied in that order, as Hugging Face does), from a seeded RNG
// so the same seed gives the same output.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace lazykv {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;

  // Throws Error(kInvalidArgument) naming the bad field and its valid range.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest logit (the lowest index among equals).
int32_t argmax(std::span<const float> logits);

}  // namespace lazykv
