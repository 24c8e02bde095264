#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"
#include "common/sampling_limits.h"
#include "common/seeded_random.h"

namespace lazykv {

void SamplingParams::validate() const {
  auto bad = [](const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, msg); };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) bad("temperature must be >= 0 (0 = greedy)");
  if (top_k < 0) bad("top_k must be >= 0 (0 = off)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p must be in [0, 1]");
  // The API's bounds (common/sampling_limits.h), held here too: a worker
  // serves remote coordinators.
  using namespace sampling_limits;
  // In float, as the values arrive: the API checked them as doubles before
  // narrowing, so a bound itself (0.01) must pass here too.
  const auto within = [](float v, double lo, double hi) { return v >= float(lo) && v <= float(hi); };
  if (!within(presence_penalty, -kMaxAbsPenalty, kMaxAbsPenalty)) bad("presence_penalty must be in [-2, 2]");
  if (!within(frequency_penalty, -kMaxAbsPenalty, kMaxAbsPenalty)) bad("frequency_penalty must be in [-2, 2]");
  if (!within(repetition_penalty, kMinRepetitionPenalty, kMaxRepetitionPenalty)) {
    bad("repetition_penalty must be in [0.01, 100] (1 = off)");
  }
  if (logit_bias.size() > kMaxLogitBiasEntries) {
    bad("logit_bias has more than " + std::to_string(kMaxLogitBiasEntries) + " entries");
  }
  if (end_tokens.size() > kMaxEndTokens) bad("more than " + std::to_string(kMaxEndTokens) + " end tokens");
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0) bad("logit_bias: token id " + std::to_string(token) + " is negative");
    if (!within(bias, -kMaxAbsLogitBias, kMaxAbsLogitBias)) {
      bad("logit_bias: the bias of token " + std::to_string(token) + " must be in [-100, 100]");
    }
  }
  if (min_tokens < 0) bad("min_tokens must be >= 0");
  for (int32_t token : end_tokens) {
    if (token < 0) bad("end token id " + std::to_string(token) + " is negative");
  }
}

bool SamplingParams::adjusts_logits() const {
  return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f || !logit_bias.empty() ||
         (min_tokens > 0 && !end_tokens.empty());
}

namespace {

bool penalizes(const SamplingParams& p) {
  return p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f;
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[size_t(best)] || std::isnan(logits[size_t(best)])) best = int32_t(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params) { params.validate(); }

void Sampler::start(std::span<const int32_t> tokens, int32_t generated) {
  generated = std::clamp(generated, 0, int32_t(tokens.size()));
  generated_ = 0;
  seen_.clear();
  const size_t prompt = tokens.size() - size_t(generated);
  // Only the repetition penalty looks at the prompt.
  if (params_.repetition_penalty != 1.0f) {
    for (size_t i = 0; i < prompt; ++i) seen_[tokens[i]].in_prompt = true;
  }
  for (size_t i = prompt; i < tokens.size(); ++i) count_output(tokens[i]);
}

void Sampler::count_output(int32_t token) {
  ++generated_;
  if (penalizes(params_)) ++seen_[token].in_output;
}

bool mask_allows_any(std::span<const uint32_t> allowed, size_t n_vocab) {
  if (allowed.size() != (n_vocab + 31) / 32) return false;
  for (size_t w = 0; w < allowed.size(); ++w) {
    const size_t valid = std::min<size_t>(32, n_vocab - w * 32);
    const uint32_t in_vocab = valid == 32 ? ~uint32_t(0) : (uint32_t(1) << valid) - 1;
    if ((allowed[w] & in_vocab) != 0) return true;
  }
  return false;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const uint32_t> allowed) {
  const int32_t token = pick(adjust(logits, allowed));
  count_output(token);
  return token;
}

std::span<const float> Sampler::adjust(std::span<const float> logits, std::span<const uint32_t> allowed) {
  const bool hold_end = generated_ < params_.min_tokens && !params_.end_tokens.empty();
  if (params_.logit_bias.empty() && !hold_end && seen_.empty() && allowed.empty()) return logits;
  adjusted_.assign(logits.begin(), logits.end());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < allowed.size(); ++w) {
    if (allowed[w] == ~uint32_t(0)) continue;
    const size_t end = std::min(adjusted_.size(), w * 32 + 32);
    if (allowed[w] == 0) {  // most words, outside strings
      std::fill(adjusted_.begin() + ptrdiff_t(w * 32), adjusted_.begin() + ptrdiff_t(end), kNegInf);
      continue;
    }
    for (size_t t = w * 32; t < end; ++t) {
      if (!(allowed[w] >> (t % 32) & 1)) adjusted_[t] = kNegInf;
    }
  }
  const auto in_vocab = [&](int32_t token) { return size_t(token) < adjusted_.size(); };
  for (const auto& [token, bias] : params_.logit_bias) {
    if (in_vocab(token)) adjusted_[size_t(token)] += bias;
  }
  if (hold_end) {
    for (int32_t token : params_.end_tokens) {
      if (in_vocab(token)) adjusted_[size_t(token)] = -std::numeric_limits<float>::infinity();
    }
  }
  const float repetition = params_.repetition_penalty;
  for (const auto& [token, seen] : seen_) {
    if (!in_vocab(token)) continue;
    float& logit = adjusted_[size_t(token)];
    if (repetition != 1.0f) logit = logit > 0.0f ? logit / repetition : logit * repetition;
    if (seen.in_output > 0) logit -= params_.presence_penalty + params_.frequency_penalty * float(seen.in_output);
  }
  return adjusted_;
}

// Temperature sampling over the tokens top_k, top_p and min_p leave. The
// cuts need the tokens in descending order of probability, but only as far
// as they reach: a peaked distribution sorts a few dozen of the vocabulary's
// tokens, and without a cut nothing is sorted (a full sort of 49,152 took
// 4 ms a token, bench/sampler_bench.cc).
int32_t Sampler::pick(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return argmax(logits);
  auto& c = candidates_;
  c.resize(logits.size());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float top = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float scaled = logits[i] / params_.temperature;
    c[i] = {std::isnan(scaled) ? kNegInf : scaled, int32_t(i)};  // NaN would break the sort's ordering
    top = std::max(top, c[i].first);
  }
  if (!std::isfinite(top)) return argmax(logits);  // a tiny temperature overflowed: that is greedy
  // exp is monotonic: the weights sort as the logits do.
  for (auto& e : c) e.first = std::exp(e.first - top);
  const auto by_weight = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const size_t limit = params_.top_k > 0 ? std::min(c.size(), size_t(params_.top_k)) : c.size();
  size_t sorted = 0;
  const auto sort_to = [&](size_t want) {  // c[0, want) in order; grows at least 4x at a time
    want = std::min(limit, std::max(want, 4 * sorted));
    if (want > sorted) std::partial_sort(c.begin() + ptrdiff_t(sorted), c.begin() + ptrdiff_t(want), c.end(), by_weight);
    sorted = std::max(sorted, want);
  };
  if (limit < c.size()) sort_to(limit);
  // Probabilities stay unnormalized weights; the cuts scale by their sum.
  double sum = 0.0;  // over the top_k survivors (all tokens without top_k)
  for (size_t i = 0; i < limit; ++i) sum += c[i].first;
  size_t n = limit;
  double kept = sum;  // weight of the first n
  if (params_.top_p < 1.0f) {
    const double nucleus = double(params_.top_p) * sum;
    double cum = 0.0;
    size_t keep = 0;
    while (keep < n && cum < nucleus) {
      if (keep == sorted) sort_to(64);
      cum += c[keep++].first;
    }
    n = keep;
    kept = cum;
  }
  if (params_.min_p > 0.0f) {
    sort_to(64);
    const double threshold = double(c[0].first) * params_.min_p;
    double cum = c[0].first;
    size_t keep = 1;
    for (; keep < n; ++keep) {
      if (keep == sorted) sort_to(keep + 1);
      if (c[keep].first < threshold) break;
      cum += c[keep].first;
    }
    n = keep;
    kept = cum;
  }
  // The draw needs no order: c[0, n) are the kept tokens (sorted where a cut
  // was made, as they lie otherwise), and any order samples the same
  // distribution. 53 random bits -> [0, 1): portable, unlike
  // std::uniform_real_distribution; this token's, by its index alone.
  const uint64_t bits = splitmix64_at(params_.seed, uint64_t(generated_));
  const double u = double(bits >> 11) * (1.0 / 9007199254740992.0) * kept;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += c[i].first;
    if (u < acc) return c[i].second;
  }
  return c[n - 1].second;  // rounding left u at the very end
}

}  // namespace lazykv
