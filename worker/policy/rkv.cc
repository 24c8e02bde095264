// R-KV's scoring (rkv.h says what). The mean similarity needs no n x n
// matrix: sum_j cos(k_s, k_j) for j != s is khat_s . (sum_j khat_j) - 1.
#include "worker/policy/rkv.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/eviction.h"
#include "worker/policy/policies.h"

namespace lazykv {

RkvPolicy::RkvPolicy(const PolicyConfig& config, const PolicyShape& shape)
    : EvictionPolicy(config, shape, shape.n_head_kv, Needs{.keep_queries = config.get_int("window")}),
      budget_(config.get_int("budget")),
      period_(config.get_int("period")),
      window_(config.get_int("window")),
      kernel_(config.get_int("kernel")),
      lambda_(float(config.get("lambda"))) {}

bool RkvPolicy::compression_due() const {
  const int32_t t = step();
  return prompt_just_completed() || (t >= 1 && t % period_ == 0);
}

void RkvPolicy::select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
                       std::vector<std::vector<int32_t>>& keep) {
  if (!compression_due()) return;
  Scratch& s = scratch(layer);
  for (size_t h = 0; h < heads.size(); ++h) {
    const Head& hd = heads[h];
    if (hd.n <= budget_) continue;
    score_older(hd, cache.view(seq, layer, int(h)), s);
    keep_top(s.pooled.data(), hd.n - window_, hd.n, budget_ - window_, keep[h], s.index);
  }
}

void RkvPolicy::score_older(const Head& hd, const cpu::KvPages& kv, Scratch& s) const {
  const int qph = queries_per_head();
  const int D = shape().head_dim;
  const int32_t n = hd.n;
  const int32_t nc = n - window_;

  // Importance.
  const auto queries = recent_queries(hd);
  s.scores.assign(size_t(nc), 0.0f);
  s.probs.resize(size_t(qph) * size_t(n));
  s.aux.resize(size_t(nc));
  for (const auto& [pos, q] : queries) {
    cpu::attention_logits(q, qph, D, kv, pos, shape().attn_scale, s.probs.data());
    for (int32_t i = 0; i < nc; ++i) {
      float m = s.probs[size_t(i)];
      for (int g = 1; g < qph; ++g) m = std::max(m, s.probs[size_t(g) * size_t(n) + size_t(i)]);
      s.aux[size_t(i)] = m;
    }
    cpu::softmax_inplace(s.aux.data(), nc);
    for (int32_t i = 0; i < nc; ++i) s.scores[size_t(i)] += s.aux[size_t(i)];
  }
  if (!queries.empty()) {
    for (float& v : s.scores) v /= float(queries.size());
  }
  s.pooled.resize(size_t(nc));
  cpu::max_pool1d(s.scores.data(), nc, kernel_, s.pooled.data());

  // Redundancy: normalized keys, their sum, each key's mean similarity.
  s.keys.resize(size_t(n) * size_t(D));
  cpu::gather_keys(kv, D, s.keys.data());
  std::vector<float>& sum = s.scores;  // importance already pooled; reuse as the key sum
  sum.assign(size_t(D), 0.0f);
  for (int32_t i = 0; i < nc; ++i) {
    float* k = s.keys.data() + size_t(i) * size_t(D);
    float norm = 0.0f;
    for (int d = 0; d < D; ++d) norm += k[d] * k[d];
    const float inv = 1.0f / (std::sqrt(norm) + 1e-8f);
    for (int d = 0; d < D; ++d) {
      k[d] *= inv;
      sum[size_t(d)] += k[d];
    }
  }
  s.aux.resize(size_t(nc));
  float max_red = -INFINITY;
  for (int32_t i = 0; i < nc; ++i) {
    const float* k = s.keys.data() + size_t(i) * size_t(D);
    float dot = 0.0f, self = 0.0f;
    for (int d = 0; d < D; ++d) {
      dot += k[d] * sum[size_t(d)];
      self += k[d] * k[d];
    }
    const float mean = nc > 1 ? (dot - self) / float(nc - 1) : 0.0f;
    s.aux[size_t(i)] = mean;
    max_red = std::max(max_red, mean);
  }
  double z = 0.0;
  for (int32_t i = 0; i < nc; ++i) z += std::exp(double(s.aux[size_t(i)] - max_red));
  for (int32_t i = 0; i < nc; ++i) {
    const float redundancy = float(std::exp(double(s.aux[size_t(i)] - max_red)) / z);
    s.pooled[size_t(i)] = lambda_ * s.pooled[size_t(i)] - (1.0f - lambda_) * redundancy;
  }
}

std::unique_ptr<EvictionPolicy> make_rkv_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<RkvPolicy>(config, shape);
}

}  // namespace lazykv
