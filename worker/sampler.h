// Token sampling: greedy, or temperature with top-k, top-p and min-p
// filtering (applied in that order, as Hugging Face does). The draw for the
// i-th generated token is splitmix64_at(seed, i): the same seed gives the
// same output, and a sequence preempted and started again (start() with
// what it generated) goes on as if it had never stopped. Before either, the
// logits may be adjusted: logit_bias, end tokens masked until min_tokens,
// the repetition penalty (prompt and output), and OpenAI's presence and
// frequency penalties (output only).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lazykv {

struct SamplingParams {
  static constexpr size_t kMaxEndTokens = 1024;

  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  float presence_penalty = 0.0f;    // [-2, 2]: subtracted once from each token generated so far
  float frequency_penalty = 0.0f;   // [-2, 2]: subtracted once per time it was generated
  float repetition_penalty = 1.0f;  // > 0, 1: off; a seen token's logit is divided by it (multiplied when negative)
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, added to its logit), bias in [-100, 100]
  int32_t min_tokens = 0;           // end_tokens are never sampled before this many tokens
  std::vector<int32_t> end_tokens;  // the end-of-generation tokens min_tokens holds back

  // Whether sample() changes the logits before it picks.
  bool adjusts_logits() const;
  // Throws Error(kInvalidArgument) naming the bad field and its valid range.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // The tokens the sequence starts from: its prompt, whose last `generated`
  // tokens were sampled before (a sequence preempted and started again).
  // The penalties count those as output.
  void start(std::span<const int32_t> tokens, int32_t generated);
  // Picks the next token among the `allowed` ones (bit t of word t / 32;
  // empty: any) and counts it as output. The caller checks that the mask
  // covers the logits and allows one of them (mask_allows_any).
  int32_t sample(std::span<const float> logits, std::span<const uint32_t> allowed = {});

 private:
  std::span<const float> adjust(std::span<const float> logits, std::span<const uint32_t> allowed);
  int32_t pick(std::span<const float> logits);
  void count_output(int32_t token);

  struct Seen {
    int32_t in_output = 0;   // times generated
    bool in_prompt = false;  // in the prompt (the repetition penalty counts both)
  };
  SamplingParams params_;
  std::vector<std::pair<float, int32_t>> candidates_;
  int32_t generated_ = 0;
  std::unordered_map<int32_t, Seen> seen_;  // kept only when a penalty is on
  std::vector<float> adjusted_;
};

// Index of the largest logit (the lowest index among equals).
int32_t argmax(std::span<const float> logits);

// Whether `allowed` has a word for each of n_vocab tokens and allows one of them.
bool mask_allows_any(std::span<const uint32_t> allowed, size_t n_vocab);

}  // namespace lazykv
