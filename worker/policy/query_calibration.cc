#include "worker/policy/query_calibration.h"

#include <cmath>
#include <complex>
#include <filesystem>

#include "common/error.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/policy/policy.h"

namespace lazykv {
namespace {

// Rides on the hook that hands a policy its queries: a non-evicting "policy"
// whose ring holds one chunk, summed into the statistics after each layer.
class QueryCollector final : public EvictionPolicy {
 public:
  QueryCollector(const PolicyShape& shape, int32_t chunk, const RopeTable& rope, cpu::RopeStyle style, int n_head)
      : EvictionPolicy(make_policy_config("full"), shape, shape.n_head_kv, Needs{.keep_queries = chunk}),
        rope_(rope),
        style_(style),
        n_head_(n_head),
        n_freq_(int(rope.inv_freq.size())),
        sum_(size_t(shape.n_layer) * size_t(n_head) * size_t(n_freq_)),
        abs_sum_(sum_.size()) {}

  void set_pass(int32_t first_pos) { pass_first_ = first_pos; }

  QueryStats result(int64_t tokens, const std::string& model) const {
    QueryStats s;
    s.n_layer = shape().n_layer;
    s.n_head = n_head_;
    s.n_freq = n_freq_;
    s.tokens = tokens;
    s.model = model;
    for (size_t i = 0; i < sum_.size(); ++i) {
      s.mean_re.push_back(float(sum_[i].real() / double(tokens)));
      s.mean_im.push_back(float(sum_[i].imag() / double(tokens)));
      s.abs_mean.push_back(float(abs_sum_[i] / double(tokens)));
    }
    return s;
  }

 protected:
  void select(int layer, std::span<Head> heads, const KvCache&, SeqId, std::vector<std::vector<int32_t>>&) override {
    const int D = shape().head_dim, F = n_freq_, qph = queries_per_head();
    for (size_t h = 0; h < heads.size(); ++h) {
      for (const auto& [pos, q] : recent_queries(heads[h])) {
        if (pos < pass_first_) continue;  // left in the ring by an earlier chunk
        for (int g = 0; g < qph; ++g) {
          const float* v = q + size_t(g) * size_t(D);
          const size_t o = (size_t(layer) * size_t(n_head_) + h * size_t(qph) + size_t(g)) * size_t(F);
          for (int f = 0; f < F; ++f) {
            // The kernel turned the pair by theta (computed in float) and scaled it by mscale.
            const float theta = float(pos) * rope_.inv_freq[size_t(f)];
            const cpu::RopePair p = cpu::rope_pair(style_, f, F);
            const std::complex<double> pair =
                std::complex<double>(v[p.re], v[p.im]) * std::polar(1.0 / double(rope_.mscale), -double(theta));
            sum_[o + size_t(f)] += pair;
            abs_sum_[o + size_t(f)] += std::abs(pair);
          }
        }
      }
    }
  }

 private:
  const RopeTable& rope_;
  cpu::RopeStyle style_;
  int n_head_, n_freq_;
  int32_t pass_first_ = 0;
  std::vector<std::complex<double>> sum_;  // [layer][head][freq], over positions
  std::vector<double> abs_sum_;
};

}  // namespace

QueryStats measure_query_stats(const Model& model, std::span<const int32_t> tokens, ThreadPool& pool, int32_t chunk) {
  const ModelConfig& c = model.config();
  if (tokens.size() < 2 || int64_t(tokens.size()) > int64_t(c.n_ctx_train)) {
    throw Error(ErrorCode::kInvalidArgument, "calibration: needs between 2 and " + std::to_string(c.n_ctx_train) +
                                                 " tokens, got " + std::to_string(tokens.size()));
  }
  if (c.n_rot != c.head_dim) {
    throw Error(ErrorCode::kInvalidArgument, "calibration: RoPE turns " + std::to_string(c.n_rot) + " of the head's " +
                                                 std::to_string(c.head_dim) + " dimensions; query statistics need all");
  }
  PolicyShape shape = policy_shape(c, 0, int32_t(tokens.size()));  // every position is "decode": every query is kept
  QueryCollector collector(shape, chunk, model.rope(), c.rope_style, c.n_head);
  KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 64, 0});
  ForwardPass forward(model, cache, pool);
  cache.add_sequence(0, collector.heads_per_layer());
  for (size_t first = 0; first < tokens.size(); first += size_t(chunk)) {
    const std::span<const int32_t> part = tokens.subspan(first, std::min(size_t(chunk), tokens.size() - first));
    collector.set_pass(int32_t(first));
    const BatchItem item{0, part, int32_t(first), false, &collector};
    forward.run({&item, 1});
  }
  return collector.result(int64_t(tokens.size()), std::filesystem::path(model.path()).filename().string());
}

}  // namespace lazykv
