// `trimkv`: TRIM-KV (arXiv 2512.03324). A learned gate gives each token, as
// it is created, a retention rate beta per KV head (retention_gates.h); at
// position t the slot of a token created at j scores (t - j) · log beta_j,
// its retention decayed since creation. Whenever a pass leaves a KV head
// holding budget + `period` slots (prefill chunks included), the head keeps
// its `budget` highest. No attention statistics and no queries: the score is
// known when the token is written. With `keep_prompt` the prompt is never a
// candidate. Budgets are per (layer, KV head), as every policy here has
// them: a head's selection needs no other layer's scores (end_step runs per
// layer) and tensor-parallel ranks, which hold different heads, never need
// to agree, where the authors' global top-k over all layers and heads would.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "worker/policy/policies.h"
#include "worker/policy/retention_gates.h"

namespace lazykv {
namespace {

class TrimKvPolicy final : public EvictionPolicy {
 public:
  TrimKvPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv, Needs{.slot_score = true}),
        budget_(config.get_int("budget")),
        period_(config.get_int("period")),
        gates_(shape.retention_gates),
        pending_(size_t(shape.n_layer)) {}

  bool wants_layer_input() const override { return true; }
  // A prompt token's rate comes from its own layer inputs: none may skip the pass.
  int32_t reusable_prompt() const override { return 0; }

  // Rates given directly (trace replay), as the gates would give them.
  void observe_retention(int layer, int32_t start_pos, std::span<const float> log_beta, int64_t n) override {
    if (int64_t(log_beta.size()) != n * gates_->n_head_kv) {
      throw Error(ErrorCode::kInternal, "policy trimkv: rates of another shape");
    }
    Pending& p = pending_[size_t(layer)];
    p.start_pos = start_pos;
    p.tokens = int32_t(n);
    p.all_heads.assign(log_beta.begin(), log_beta.end());
  }

 protected:
  // A slot's rate is unknown until its layer input comes: NaN, so that a
  // rate never delivered is an error, never an immortal slot (0 = beta 1).
  void init_slots(Head& h, int32_t first, int32_t count, int32_t) override {
    std::fill_n(h.score.begin() + first, count, std::numeric_limits<float>::quiet_NaN());
  }

  // Rates for the pass's new tokens, kept until the layer's end_step writes
  // them into the new slots (Head::score holds log beta).
  void read_layer_input(int layer, int32_t start_pos, const float* rows, int64_t n, ThreadPool& pool) override {
    Pending& p = pending_[size_t(layer)];
    p.start_pos = start_pos;
    p.tokens = int32_t(n);
    p.all_heads.resize(size_t(n) * size_t(gates_->n_head_kv));
    retention_log_beta(*gates_, layer, rows, n, p.all_heads.data(), scratch_, pool);
  }

  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    write_pending_rates(layer, heads, cache, seq);
    Scratch& s = scratch(layer);
    for (size_t h = 0; h < heads.size(); ++h) {
      const Head& hd = heads[h];
      if (hd.n < budget_ + period_) continue;
      const std::span<const int32_t> positions = cache.positions(seq, layer, int(h));
      const int32_t t = positions.back();  // the newest slot is the pass's last token
      s.scores.resize(size_t(hd.n));
      for (int32_t i = 0; i < hd.n; ++i) {
        s.scores[size_t(i)] = float(t - positions[size_t(i)]) * hd.score[size_t(i)];
      }
      keep_top(s.scores.data(), hd.n, hd.n, budget_, keep[h], s.index);
    }
  }

 private:
  struct Pending {
    int32_t start_pos = 0, tokens = 0;
    std::vector<float> all_heads;  // [tokens][gates' n_head_kv]
  };

  // The pass's new slots are each head's last p.tokens, at p.start_pos on.
  void write_pending_rates(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq) {
    Pending& p = pending_[size_t(layer)];
    const int offset = shape().kv_head_offset;  // this shard's first KV head
    for (size_t h = 0; h < heads.size(); ++h) {
      Head& hd = heads[h];
      const int32_t first = hd.n - p.tokens;
      if (first < 0 || (p.tokens > 0 && cache.positions(seq, layer, int(h))[size_t(first)] != p.start_pos)) {
        throw Error(ErrorCode::kInternal, "policy trimkv: layer " + std::to_string(layer) + " has rates for " +
                                              std::to_string(p.tokens) + " tokens from position " +
                                              std::to_string(p.start_pos) + " that its slots do not match");
      }
      for (int32_t i = 0; i < p.tokens; ++i) {
        hd.score[size_t(first + i)] = p.all_heads[size_t(i) * size_t(gates_->n_head_kv) + size_t(offset) + h];
      }
      if (hd.n > 0 && std::isnan(hd.score[size_t(hd.n - 1)])) {
        throw Error(ErrorCode::kInternal, "policy trimkv: layer " + std::to_string(layer) +
                                              " ended a pass without its layer inputs");
      }
    }
    p.tokens = 0;
    if (p.all_heads.capacity() > 64 * size_t(gates_->n_head_kv)) p.all_heads = {};  // a prompt's worth, once
  }


  int32_t budget_, period_;
  std::shared_ptr<const RetentionGates> gates_;
  std::vector<Pending> pending_;  // [n_layer]
  RetentionScratch scratch_;      // observe_layer_input runs on the pass's thread, one layer at a time
};

}  // namespace

std::string trimkv_unavailable(const PolicyShape& shape) {
  if (!shape.retention_gates) {
    return shape.retention_gates_missing.empty() ? "no retention gates (they belong beside the model file)"
                                                 : shape.retention_gates_missing;
  }
  const RetentionGates& g = *shape.retention_gates;
  if (g.n_layer != shape.n_layer || g.n_head_kv < shape.kv_head_offset + shape.n_head_kv) {
    return "the retention gates (" + std::to_string(g.n_layer) + " layers, " + std::to_string(g.n_head_kv) +
           " KV heads) do not fit this model (" + std::to_string(shape.n_layer) + " layers, KV heads up to " +
           std::to_string(shape.kv_head_offset + shape.n_head_kv) + ")";
  }
  return "";
}

std::unique_ptr<EvictionPolicy> make_trimkv_policy(const PolicyConfig& config, const PolicyShape& shape) {
  if (std::string why = trimkv_unavailable(shape); !why.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "policy trimkv: " + why);
  }
  return std::make_unique<TrimKvPolicy>(config, shape);
}

}  // namespace lazykv
