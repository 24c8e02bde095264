#include "kernels/cpu/eviction.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"

namespace lazykv::cpu {

void lazy_update(const uint8_t* hits, int32_t* last, int32_t* mri, int32_t n, int32_t t) {
  for (int32_t s = 0; s < n; ++s) {
    if (hits[s] != 0) {
      mri[s] = std::max(mri[s], t - last[s]);
      last[s] = t;
    }
  }
}

void lazy_scores(const int32_t* last, const int32_t* mri, int32_t n, int32_t t, float* out) {
  for (int32_t s = 0; s < n; ++s) {
    const float m = float(mri[s]);
    // exp overflows to inf for mri == 0 (1e-5 denominator), giving 0: intended.
    const float recency = 2.0f / (1.0f + std::exp(1.0f + float(t - last[s]) / (m + 1e-5f)));
    const float recurrence = mri[s] == 0 ? 0.0f : 2.0f / (1.0f + std::exp(m - 1.0f));
    out[s] = recency + recurrence;
  }
}

void top_k_slots(const float* scores, int32_t n, int32_t k, int32_t* keep, int32_t* scratch) {
  for (int32_t s = 0; s < n; ++s) scratch[s] = s;
  const auto better = [scores](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  if (k < n) std::nth_element(scratch, scratch + k, scratch + n, better);
  std::copy(scratch, scratch + k, keep);
  std::sort(keep, keep + k);
}

void caote_scores(const float* p, const float* values, int32_t n, int head_dim, float* o, float* out) {
  std::fill(o, o + head_dim, 0.0f);
  for (int32_t s = 0; s < n; ++s) {
    const float* v = values + int64_t(s) * head_dim;
    for (int d = 0; d < head_dim; ++d) o[d] += p[s] * v[d];
  }
  for (int32_t s = 0; s < n; ++s) {
    const float* v = values + int64_t(s) * head_dim;
    float sq = 0.0f;
    for (int d = 0; d < head_dim; ++d) sq += (o[d] - v[d]) * (o[d] - v[d]);
    const float rest = 1.0f - p[s];
    out[s] = rest > 0.0f ? p[s] / rest * std::sqrt(sq) : INFINITY;
  }
}

void obcache_accumulate(const float* logits, int32_t n_q, const float* values, int32_t n, int head_dim,
                        float* probs, float* o, float* acc) {
  for (int32_t r = 0; r < n_q; ++r) {
    const float* z = logits + int64_t(r) * n;
    std::copy(z, z + n, probs);
    softmax_inplace(probs, n);  // a row that sees no slot becomes zeros
    std::fill(o, o + head_dim, 0.0f);
    for (int32_t s = 0; s < n; ++s) {
      const float* v = values + int64_t(s) * head_dim;
      for (int d = 0; d < head_dim; ++d) o[d] += probs[s] * v[d];
    }
    for (int32_t s = 0; s < n; ++s) {
      if (probs[s] == 0.0f) continue;  // masked or underflowed: no change (and no 0 * inf)
      const float* v = values + int64_t(s) * head_dim;
      float sq = 0.0f;
      for (int d = 0; d < head_dim; ++d) {
        const float delta = (1.0f + z[s]) * v[d] - z[s] * o[d];
        sq += delta * delta;
      }
      acc[s] += probs[s] * probs[s] * sq;
    }
  }
}

void max_pool1d(const float* x, int32_t n, int kernel, float* y) {
  const int32_t half = kernel / 2;
  for (int32_t s = 0; s < n; ++s) {
    float m = x[s];
    for (int32_t j = std::max(0, s - half); j <= std::min(n - 1, s + half); ++j) m = std::max(m, x[j]);
    y[s] = m;
  }
}

void avg_pool1d(const float* x, int32_t n, int kernel, float* y) {
  const int32_t half = kernel / 2;
  for (int32_t s = 0; s < n; ++s) {
    float sum = 0.0f;
    for (int32_t j = std::max(0, s - half); j <= std::min(n - 1, s + half); ++j) sum += x[j];
    y[s] = sum / float(kernel);
  }
}

}  // namespace lazykv::cpu
