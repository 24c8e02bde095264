// `vase`: VaSE, value-aware stochastic eviction (arXiv 2606.03928). Whenever a
// decode step leaves a KV head holding more than `budget` slots and a
// multiple of `window`, the `window` newest slots stay and, of the older
// candidates, budget - window are kept:
//   attention (sketch = 0, VaSE-AttnV): the `large` x budget candidates (at
//     least `sinks`) with the widest value range (max - min over the head
//     dimension; the `sinks` first slots count as infinite) are reserved; the rest are sampled
//     without replacement with probability proportional to their attention
//     score: each remembered query's softmax over the candidates, averaged
//     over the window and the GQA group, average-pooled with `kernel`;
//   sketch (sketch = 1, VaSE-DKV): the top candidates by |k G|^2 |v G|^2 for
//     a Gaussian G [head_dim][rank] / sqrt(rank) drawn afresh at every
//     eviction, one per layer (its KV heads share it, as the authors draw
//     it); the sinks first.
// Sampling is Efraimidis-Spirakis: each candidate's key log(u) / w with u
// uniform in (0, 1), the top keys kept, which is sampling proportional to w
// without replacement. Every u comes from a SplitMix64 stream named by
// (seed, layer, KV head of the model, step), so a run is reproducible, needs
// no state, and draws the same whatever the tensor-parallel split.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "common/error.h"
#include "common/seeded_random.h"
#include "kernels/cpu/eviction.h"
#include "worker/policy/policies.h"

namespace lazykv {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kMaxRank = 256;  // the catalog's limit on rank

// The stream of one (layer, head, step); the policy's draws are its outputs.
uint64_t draw_stream(uint64_t seed, int layer, int head, int32_t step) {
  return splitmix64_at(splitmix64_at(splitmix64_at(seed, uint64_t(layer)), uint64_t(head)), uint64_t(step));
}

class VasePolicy final : public EvictionPolicy {
 public:
  VasePolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv,
                       Needs{.keep_queries = config.get_int("sketch") ? 0 : config.get_int("window")}),
        budget_(config.get_int("budget")),
        window_(config.get_int("window")),
        sinks_(config.get_int("sinks")),
        kernel_(config.get_int("kernel")),
        rank_(config.get_int("rank")),
        large_(config.get("large")),
        sketch_(config.get_int("sketch") != 0),
        seed_(uint64_t(config.get("seed"))) {
    if (rank_ > kMaxRank) throw Error(ErrorCode::kInternal, "policy vase: rank above " + std::to_string(kMaxRank));
  }

 protected:
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    if (step() < 1) return;  // decode steps only, as the authors evict
    Scratch& s = scratch(layer);
    bool sketch_drawn = false;
    for (size_t h = 0; h < heads.size(); ++h) {
      const Head& hd = heads[h];
      if (hd.n <= budget_ || hd.n % window_ != 0) continue;
      const cpu::KvPages kv = cache.view(seq, layer, int(h));
      const int32_t nc = hd.n - window_;
      s.values.resize(size_t(hd.n) * size_t(shape().head_dim));
      cpu::gather_values(kv, shape().head_dim, s.values.data());
      if (sketch_) {
        if (!sketch_drawn) draw_sketch(draw_stream(seed_, layer, 0, step()), s.aux);
        sketch_drawn = true;
        sketch_scores(kv, nc, s);
      } else {
        attention_scores(hd, kv, nc, s);
        // Streams by the model's KV head, so tensor-parallel ranks draw as one.
        sample_keys(draw_stream(seed_, layer, shape().kv_head_offset + int(h), step()), nc, keep[h], s);
      }
      keep_top(s.pooled.data(), nc, hd.n, budget_ - window_, keep[h], s.index);
    }
  }

 private:
  // s.pooled[0, nc) = the pooled attention of the remembered queries.
  void attention_scores(const Head& hd, const cpu::KvPages& kv, int32_t nc, Scratch& s) const {
    const int qph = queries_per_head();
    const size_t n = size_t(hd.n);
    const auto queries = recent_queries(hd);
    s.scores.assign(size_t(nc), 0.0f);
    s.probs.resize(size_t(qph) * n);
    for (const auto& [pos, q] : queries) {
      cpu::attention_logits(q, qph, shape().head_dim, kv, pos, shape().attn_scale, s.probs.data());
      for (int g = 0; g < qph; ++g) {
        float* p = s.probs.data() + size_t(g) * n;
        cpu::softmax_inplace(p, nc);  // over the candidates only
        for (int32_t i = 0; i < nc; ++i) s.scores[size_t(i)] += p[i];
      }
    }
    const float rows = float(std::max<size_t>(queries.size(), 1) * size_t(qph));
    for (float& v : s.scores) v /= rows;
    s.pooled.resize(size_t(nc));
    cpu::avg_pool1d(s.scores.data(), nc, kernel_, s.pooled.data());
  }

  // Turns s.pooled[0, nc) into sampling keys: +inf for the reserved slots
  // (widest value ranges, sinks first), log(u) / w for the others (-inf
  // where w = 0). `reserved` is scratch. A kept prompt (the first `lead`
  // slots, kept by keep_top) is outside the reserve, which is `large` of
  // what the prompt leaves of the budget.
  void sample_keys(uint64_t stream, int32_t nc, std::vector<int32_t>& reserved, Scratch& s) const {
    const int D = shape().head_dim;
    const int32_t lead = std::min(kept_prompt_len(), nc);
    s.aux.resize(size_t(nc));
    for (int32_t i = 0; i < nc; ++i) {
      const float* v = s.values.data() + size_t(i) * size_t(D);
      const auto [lo, hi] = std::minmax_element(v, v + D);
      s.aux[size_t(i)] = i < sinks_ ? kInf : *hi - *lo;
    }
    const int32_t n_large = std::min(std::max(int32_t(std::floor(large_ * double(budget_ - lead))), sinks_ - lead),
                                     budget_ - window_ - lead);  // the sinks always fit
    reserved.resize(size_t(std::max(n_large, 0)));
    s.index.resize(size_t(nc - lead));
    cpu::top_k_slots(s.aux.data() + lead, nc - lead, int32_t(reserved.size()), reserved.data(), s.index.data());
    for (int32_t& i : reserved) i += lead;
    for (int32_t i = 0; i < nc; ++i) {
      const float w = s.pooled[size_t(i)];
      const double u = uniform_open(splitmix64_at(stream, uint64_t(i)));
      s.pooled[size_t(i)] = w > 0.0f ? float(std::log(u) / double(w)) : -kInf;
    }
    for (int32_t i : reserved) s.pooled[size_t(i)] = kInf;
  }

  // G [head_dim][rank] into g: standard normals (Box-Muller on pairs of
  // draws) over sqrt(rank).
  void draw_sketch(uint64_t stream, std::vector<float>& g) const {
    const size_t count = size_t(shape().head_dim) * size_t(rank_);
    g.resize(count);
    const double scale = 1.0 / std::sqrt(double(rank_));
    for (size_t j = 0; j < count; ++j) {
      const double u1 = uniform_open(splitmix64_at(stream, 2 * j));
      const double u2 = uniform_open(splitmix64_at(stream, 2 * j + 1));
      g[j] = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2) * scale);
    }
  }

  // s.pooled[0, nc) = |k G|^2 |v G|^2 with G in s.aux; +inf for the sinks.
  // The projections run along G's rows, all `rank` columns at once (the loop
  // over columns vectorizes); each column still sums over d in order.
  void sketch_scores(const cpu::KvPages& kv, int32_t nc, Scratch& s) const {
    const int D = shape().head_dim;
    s.keys.resize(size_t(nc + window_) * size_t(D));
    cpu::gather_keys(kv, D, s.keys.data());
    s.pooled.resize(size_t(nc));
    std::array<float, kMaxRank> kg, vg;
    for (int32_t i = 0; i < nc; ++i) {
      const float* k = s.keys.data() + size_t(i) * size_t(D);
      const float* v = s.values.data() + size_t(i) * size_t(D);
      std::fill_n(kg.begin(), rank_, 0.0f);
      std::fill_n(vg.begin(), rank_, 0.0f);
      for (int d = 0; d < D; ++d) {
        const float* g = s.aux.data() + size_t(d) * size_t(rank_);
        const float kd = k[d], vd = v[d];
        for (int c = 0; c < rank_; ++c) {
          kg[size_t(c)] += kd * g[c];
          vg[size_t(c)] += vd * g[c];
        }
      }
      float k2 = 0.0f, v2 = 0.0f;
      for (int c = 0; c < rank_; ++c) {
        k2 += kg[size_t(c)] * kg[size_t(c)];
        v2 += vg[size_t(c)] * vg[size_t(c)];
      }
      s.pooled[size_t(i)] = i < sinks_ ? kInf : k2 * v2;
    }
  }

  int32_t budget_, window_, sinks_, kernel_, rank_;
  double large_;
  bool sketch_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_vase_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<VasePolicy>(config, shape);
}

}  // namespace lazykv
