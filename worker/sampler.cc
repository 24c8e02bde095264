#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"

namespace lazykv {

void SamplingParams::validate() const {
  auto bad = [](const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, msg); };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) bad("temperature must be >= 0 (0 = greedy)");
  if (top_k < 0) bad("top_k must be >= 0 (0 = off)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p must be in [0, 1]");
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[size_t(best)] || std::isnan(logits[size_t(best)])) best = int32_t(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { params.validate(); }

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return argmax(logits);
  auto& c = candidates_;
  c.resize(logits.size());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    const float scaled = logits[i] / params_.temperature;
    c[i] = {std::isnan(scaled) ? kNegInf : scaled, int32_t(i)};  // NaN would break the sort's ordering
  }
  {
    float top = kNegInf;
    for (const auto& e : c) top = std::max(top, e.first);
    if (!std::isfinite(top)) return argmax(logits);  // a tiny temperature overflowed: that is greedy
  }
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = c.size();
  if (params_.top_k > 0 && size_t(params_.top_k) < n) {
    std::partial_sort(c.begin(), c.begin() + params_.top_k, c.end(), by_logit);
    n = size_t(params_.top_k);
  } else {
    std::sort(c.begin(), c.end(), by_logit);
  }
  // Softmax over the survivors (sorted descending).
  const float max = c[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    c[i].first = std::exp(c[i].first - max);
    sum += c[i].first;
  }
  for (size_t i = 0; i < n; ++i) c[i].first = float(c[i].first / sum);
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = 0;
    while (keep < n) {
      cum += c[keep].first;
      ++keep;
      if (cum >= params_.top_p) break;
    }
    n = keep;
  }
  if (params_.min_p > 0.0f) {
    const float threshold = c[0].first * params_.min_p;
    size_t keep = 1;
    while (keep < n && c[keep].first >= threshold) ++keep;
    n = keep;
  }
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += c[i].first;
  // 53 random bits -> [0, 1): portable, unlike std::uniform_real_distribution.
  const double u = double(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += c[i].first;
    if (u < acc) return c[i].second;
  }
  return c[n - 1].second;
}

}  // namespace lazykv
