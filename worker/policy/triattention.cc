// `triattention`: TriAttention (arXiv 2604.04921). Queries before RoPE
// cluster around a fixed centre per (layer, query head) and frequency pair,
// so where a query at a future position t + d will point is known ahead:
// with q_f the centre (the query statistics' complex mean), a_f the mean
// |q_f| and k_f a cached key's post-RoPE complex pair, the expected logit is
//   sum_f Re[q_f conj(k_f) e^{i w_f (t + d)}] + sum_f (a_f - |q_f|) |k_f|
// (the trigonometric series over the RoPE frequencies w_f, plus the part of
// the query's magnitude the centre does not explain). Averaged over the 17
// offsets d = 1, 2, 4, ..., 65536, the first sum is linear in k:
//   Re[w_f conj(k_f)] with w_f = q_f e^{i w_f t} C_f, C_f = mean_d e^{i w_f d},
// so a key costs one D-dot per query head. Each query head's scores are
// z-scored over the candidates, the GQA group takes their maximum, and each
// KV head keeps its top candidates (the authors' per-layer, per-head
// variant; their default also averages over layers, which would make every
// layer wait for the last). Whenever a decode step leaves a KV head holding
// budget + `period` slots, it keeps `budget`; with `keep_prompt` the prompt
// is never a candidate (and must leave room in the budget).
#include <algorithm>
#include <cmath>
#include <complex>

#include "common/error.h"
#include "kernels/cpu/eviction.h"
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

constexpr int kOffsets = 17;  // d = 2^0 ... 2^16

class TriAttentionPolicy final : public EvictionPolicy {
 public:
  TriAttentionPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{}),
        budget_(config.get_int("budget")),
        period_(config.get_int("period")),
        stats_(shape.query_stats) {
    const int F = shape.head_dim / 2;  // make_triattention_policy checked triattention_unavailable(shape)
    offset_mean_.resize(size_t(F));
    for (int f = 0; f < F; ++f) {
      std::complex<double> sum = 0.0;
      for (int j = 0; j < kOffsets; ++j) sum += std::polar(1.0, double(shape.rope_inv_freq[size_t(f)]) * double(1 << j));
      offset_mean_[size_t(f)] = sum / double(kOffsets);
    }
  }

 protected:
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    if (step() < 1) return;
    Scratch& s = scratch(layer);
    for (size_t h = 0; h < heads.size(); ++h) {
      const int32_t n = heads[h].n;
      if (n < budget_ + period_) continue;
      // The request's prompt slots come first (a resumed sequence's generated tokens compete).
      const int32_t n_kept = std::min(kept_prompt_len(), n);
      const int32_t n_candidates = n - n_kept;
      const int32_t k = std::max(budget_ - n_kept, 0);
      if (n_candidates <= k) continue;
      s.keys.resize(size_t(n) * size_t(shape().head_dim));
      cpu::gather_keys(cache.view(seq, layer, int(h)), shape().head_dim, s.keys.data());
      group_scores(layer, int(h), s.keys.data() + size_t(n_kept) * size_t(shape().head_dim), n_candidates, s);
      std::vector<int32_t>& kept = keep[h];
      kept.resize(size_t(n_kept + k));
      for (int32_t i = 0; i < n_kept; ++i) kept[size_t(i)] = i;
      s.index.resize(size_t(n_candidates));
      cpu::top_k_slots(s.pooled.data(), n_candidates, k, kept.data() + n_kept, s.index.data());
      for (int32_t i = n_kept; i < n_kept + k; ++i) kept[size_t(i)] += n_kept;
    }
  }

 private:
  // s.pooled[0, n) = the maximum over the KV head's query heads of their
  // z-scored expected logits for the keys [n][head_dim].
  void group_scores(int layer, int kv_head, const float* keys, int32_t n, Scratch& s) const {
    const int D = shape().head_dim, F = D / 2;
    const double t = double(prompt_len() + step());  // the next token's position
    s.aux.resize(size_t(3 * F));
    float* w_re = s.aux.data();
    float* w_im = w_re + F;
    float* b = w_im + F;
    s.scores.resize(size_t(n));
    s.pooled.assign(size_t(n), -INFINITY);
    for (int g = 0; g < shape().n_group; ++g) {
      const int head = (shape().kv_head_offset + kv_head) * shape().n_group + g;
      const size_t o = stats_->offset(layer, head);
      for (int f = 0; f < F; ++f) {
        const std::complex<double> centre(stats_->mean_re[o + size_t(f)], stats_->mean_im[o + size_t(f)]);
        const std::complex<double> w =
            centre * std::polar(1.0, double(shape().rope_inv_freq[size_t(f)]) * t) * offset_mean_[size_t(f)];
        w_re[f] = float(w.real());
        w_im[f] = float(w.imag());
        b[f] = stats_->abs_mean[o + size_t(f)] - float(std::abs(centre));
      }
      double sum = 0.0, sum_sq = 0.0;
      for (int32_t i = 0; i < n; ++i) {
        const float* k = keys + size_t(i) * size_t(D);
        float score = 0.0f;
        for (int f = 0; f < F; ++f) {
          const cpu::RopePair p = cpu::rope_pair(shape().rope_style, f, F);
          const float re = k[p.re], im = k[p.im];
          score += w_re[f] * re + w_im[f] * im + b[f] * std::sqrt(re * re + im * im);
        }
        s.scores[size_t(i)] = score;
        sum += score;
        sum_sq += double(score) * double(score);
      }
      const double mean = sum / double(n);
      const double sd = std::max(std::sqrt(std::max(sum_sq / double(n) - mean * mean, 0.0)), 1e-6);
      for (int32_t i = 0; i < n; ++i) {
        s.pooled[size_t(i)] = std::max(s.pooled[size_t(i)], float((double(s.scores[size_t(i)]) - mean) / sd));
      }
    }
  }

  int32_t budget_, period_;
  std::shared_ptr<const QueryStats> stats_;
  std::vector<std::complex<double>> offset_mean_;  // C_f
};

}  // namespace

std::string triattention_unavailable(const PolicyShape& shape) {
  if (!shape.query_stats) {
    return shape.query_stats_missing.empty() ? "no query statistics (they belong beside the model file)"
                                             : shape.query_stats_missing;
  }
  const QueryStats& stats = *shape.query_stats;
  const int F = shape.head_dim / 2;
  if (int(shape.rope_inv_freq.size()) != F) {
    return "needs RoPE on every dimension of the head (" +
           std::to_string(2 * shape.rope_inv_freq.size()) + " of " + std::to_string(shape.head_dim) + " rotate)";
  }
  const int last_head = (shape.kv_head_offset + shape.n_head_kv) * shape.n_group;
  if (stats.n_layer != shape.n_layer || stats.n_freq != F || stats.n_head < last_head) {
    return "the query statistics (" + std::to_string(stats.n_layer) + " layers, " +
           std::to_string(stats.n_head) + " heads, " + std::to_string(stats.n_freq) +
           " frequencies) do not fit this model";
  }
  return "";
}

std::unique_ptr<EvictionPolicy> make_triattention_policy(const PolicyConfig& config, const PolicyShape& shape) {
  if (std::string why = triattention_unavailable(shape); !why.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "policy triattention: " + why);
  }
  return std::make_unique<TriAttentionPolicy>(config, shape);
}

}  // namespace lazykv
