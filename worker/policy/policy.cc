#include "worker/policy/policy.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "common/error.h"
#include "kernels/cpu/eviction.h"
#include "worker/model.h"
#include "worker/model_config.h"
#include "worker/parallel/model_shard.h"
#include "worker/policy/policies.h"

namespace lazykv {

PolicyShape policy_shape(const ModelConfig& config, int32_t prompt_len, int32_t max_len) {
  PolicyShape shape;
  shape.n_layer = config.n_layer;
  shape.n_head_kv = config.n_head_kv;
  shape.n_group = config.n_group();
  shape.head_dim = config.head_dim;
  shape.prompt_len = prompt_len;
  shape.max_len = max_len;
  shape.rope_style = config.rope_style;
  return shape;
}

PolicyShape policy_shape(const Model& model, int32_t prompt_len, int32_t max_len) {
  PolicyShape shape = policy_shape(model.config(), prompt_len, max_len);
  shape.rope_inv_freq = model.rope().inv_freq;
  shape.query_stats = model.query_stats();
  shape.query_stats_missing = model.query_stats_missing();
  shape.token_classes = model.token_classes();
  shape.steering = model.steering();
  shape.steering_missing = model.steering_missing();
  shape.retention_gates = model.retention_gates();
  shape.retention_gates_missing = model.retention_gates_missing();
  return shape;
}

PolicyShape policy_shape(const ModelShard& shard, int32_t prompt_len, int32_t max_len) {
  PolicyShape shape = policy_shape(shard.model(), prompt_len, max_len);
  shape.n_head_kv = shard.config().n_head_kv;  // this rank's KV heads
  shape.kv_head_offset = int(shard.kv_heads().begin);
  return shape;
}

EvictionPolicy::EvictionPolicy(PolicyConfig config, const PolicyShape& shape, int heads_per_layer, Needs needs)
    : config_(std::move(config)),
      shape_(shape),
      heads_per_layer_(heads_per_layer),
      needs_(needs),
      accumulate_prefill_(needs.attn_sum && needs.attn_prefill) {
  if (shape.n_layer <= 0 || shape.n_head_kv <= 0 || shape.n_group <= 0 || shape.head_dim <= 0 ||
      shape.prompt_len < 0 || heads_per_layer <= 0 || heads_per_layer % shape.n_head_kv != 0 ||
      (shape.n_group * shape.n_head_kv) % heads_per_layer != 0) {
    throw Error(ErrorCode::kInvalidArgument, "policy " + config_.name + ": invalid model shape");
  }
  if (shape_.attn_scale == 0) shape_.attn_scale = 1.0f / std::sqrt(float(shape.head_dim));
  keep_prompt_ = config_.params.contains("keep_prompt") && config_.get("keep_prompt") != 0;
  // A ring longer than the sequence would only hold the same queries.
  if (shape.max_len > 0) needs_.keep_queries = std::min(needs_.keep_queries, shape.max_len);
  heads_.resize(size_t(shape.n_layer) * size_t(heads_per_layer));
  for (Head& h : heads_) h.stats.alpha = needs.alpha;  // query rings grow as queries arrive (query_buffer)
  scratch_.resize(size_t(shape.n_layer));
  keep_.assign(size_t(shape.n_layer), std::vector<std::vector<int32_t>>(size_t(heads_per_layer)));
}

EvictionPolicy::~EvictionPolicy() = default;

void EvictionPolicy::check_pass(int32_t start_pos, int32_t n_new) const {
  if (n_new <= 0) throw Error(ErrorCode::kInvalidArgument, "policy: a pass must append at least one token");
  if (evicts() && n_new > 1 && start_pos + n_new - 1 >= shape_.prompt_len) {
    throw Error(ErrorCode::kInvalidArgument, "policy " + config_.name +
                                                 ": decode tokens must be fed one per pass (each is its own step); "
                                                 "the prompt has " + std::to_string(shape_.prompt_len) + " tokens");
  }
}

void EvictionPolicy::begin_step(int32_t start_pos, int32_t n_new) {
  check_pass(start_pos, n_new);
  const int32_t last_pos = start_pos + n_new - 1;
  step_ = step_of(last_pos);
  pass_start_ = start_pos;
  pass_end_ = last_pos + 1;
  // Query rings grow with the positions seen, not to the window a request
  // asks for; here, before the pass, because query_buffer runs concurrently.
  const size_t ring_entries = size_t(std::min(needs_.keep_queries, pass_end_));
  const size_t stride = size_t(queries_per_head()) * size_t(shape_.head_dim);
  for (Head& h : heads_) {
    const int32_t first = h.n;
    const size_t n = size_t(first + n_new);
    if (needs_.last_mri) {
      h.last.resize(n);
      h.mri.resize(n);
    }
    if (needs_.attn_sum) h.attn.resize(n, 0.0f);
    if (needs_.slot_score) h.score.resize(n, 0.0f);
    if (needs_.hits) h.hits.resize(n, 0);
    init_slots(h, first, n_new, start_pos);
    if (h.query_pos.size() < ring_entries) {
      h.query_pos.resize(ring_entries, -1);
      h.queries.resize(ring_entries * stride);
    }
    h.n = int32_t(n);
    point_stats(h);
  }
  slots_ += int64_t(n_new) * int64_t(heads_.size());
  peak_slots_ = std::max(peak_slots_, slots_.load());
  if (pass_end_ >= shape_.prompt_len) {  // this pass's last row samples a token
    attended_slot_sum_ += slots_.load();
    ++sampling_passes_;
  }
}

void EvictionPolicy::point_stats(Head& h) const {
  h.stats.hits = needs_.hits ? h.hits.data() : nullptr;
  h.stats.attn_sum = needs_.attn_sum ? h.attn.data() : nullptr;
  h.prompt_stats.attn_sum = h.stats.attn_sum;
}

int32_t EvictionPolicy::reusable_prompt() const {
  if (needs_.attn_sum && needs_.attn_prefill) return 0;  // every prompt query's attention counts
  int32_t n = shape_.prompt_len - 1;
  if (needs_.keep_queries > 0) n = std::min(n, shape_.prompt_len - needs_.keep_queries);
  return std::max(n, 0);
}

void EvictionPolicy::init_slots(Head& h, int32_t first, int32_t count, int32_t first_pos) {
  for (int32_t i = 0; i < count; ++i) {
    const int32_t t = step_of(first_pos + i);
    if (needs_.last_mri) {
      h.last[size_t(first + i)] = t == 0 ? 0 : t - 1;
      h.mri[size_t(first + i)] = 0;
    }
  }
}

const cpu::AttentionStats* EvictionPolicy::stats(int layer, int h, int32_t pos) {
  Head& hd = head(layer, h);
  if (pos >= shape_.prompt_len) return (needs_.hits || needs_.attn_sum) ? &hd.stats : nullptr;
  // Prompt queries record attention sums only, and only when asked.
  if (!needs_.attn_sum) return nullptr;
  if (needs_.attn_prefill || (needs_.attn_last_prompt && pos == shape_.prompt_len - 1)) return &hd.prompt_stats;
  return nullptr;
}

float* EvictionPolicy::query_buffer(int layer, int h, int32_t pos) {
  const int32_t k = needs_.keep_queries;
  if (k == 0 || pos < shape_.prompt_len - k) return nullptr;
  Head& hd = head(layer, h);
  const size_t ring = size_t(pos % k);  // begin_step grew the ring to hold it
  hd.query_pos[ring] = pos;
  return hd.queries.data() + ring * size_t(queries_per_head()) * size_t(shape_.head_dim);
}

void EvictionPolicy::end_step(int layer, KvCache& cache, SeqId seq) {
  const auto t0 = std::chrono::steady_clock::now();
  std::span<Head> layer_heads(heads_.data() + size_t(layer) * size_t(heads_per_layer_), size_t(heads_per_layer_));
  for (int h = 0; h < heads_per_layer_; ++h) {
    if (cache.n_slots(seq, layer, h) != layer_heads[size_t(h)].n) {
      throw Error(ErrorCode::kInternal, "policy " + config_.name + ": state of layer " + std::to_string(layer) +
                                            " head " + std::to_string(h) + " out of step with the KV cache");
    }
  }
  std::vector<std::vector<int32_t>>& keep = keep_[size_t(layer)];
  for (auto& k : keep) k.clear();
  select(layer, layer_heads, cache, seq, keep);
  for (int h = 0; h < heads_per_layer_; ++h) {
    Head& hd = layer_heads[size_t(h)];
    const std::vector<int32_t>& k = keep[size_t(h)];
    if (needs_.hits) std::fill(hd.hits.begin(), hd.hits.end(), uint8_t(0));
    if (k.empty() || int32_t(k.size()) == hd.n) continue;
    before_compact(layer, h, hd, k, cache, seq);
    cache.compact(seq, layer, h, k);
    const auto shrink = [&](auto& v) {
      if (v.empty()) return;
      cpu::compact_slots(v.data(), std::span<const int32_t>(k));
      v.resize(k.size());
    };
    shrink(hd.last);
    shrink(hd.mri);
    shrink(hd.attn);
    shrink(hd.score);
    shrink(hd.hits);
    const int32_t dropped = hd.n - int32_t(k.size());
    hd.n = int32_t(k.size());
    point_stats(hd);
    slots_ -= dropped;
    evicted_ += dropped;
  }
  after_compact(layer, cache, seq);
  policy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

void EvictionPolicy::draft_slots(int layer, int head, const KvCache& cache, SeqId seq, std::vector<int32_t>& keep) {
  keep.resize(size_t(cache.n_slots(seq, layer, head)));
  std::iota(keep.begin(), keep.end(), 0);
}

void EvictionPolicy::observe_token(int32_t, int32_t, std::span<const float>) {}

void EvictionPolicy::observe_layer_input(int layer, int32_t start_pos, const float* rows, int64_t n,
                                         ThreadPool& pool) {
  const auto t0 = std::chrono::steady_clock::now();
  read_layer_input(layer, start_pos, rows, n, pool);
  policy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

void EvictionPolicy::read_layer_input(int, int32_t, const float*, int64_t, ThreadPool&) {}

void EvictionPolicy::observe_retention(int, int32_t, std::span<const float>, int64_t) {
  throw Error(ErrorCode::kInternal, "policy " + config_.name + " takes no retention rates");
}

float EvictionPolicy::steering_scale(int32_t, int32_t) { return 0.0f; }

void EvictionPolicy::end_draft(const DraftQueries& draft, KvCache& cache, SeqId seq, ThreadPool* pool) {
  struct Reset {  // whatever end_step throws, no pointer to the draft stays behind
    EvictionPolicy& p;
    ~Reset() {
      p.draft_done();
      p.draft_ = nullptr;
    }
  } reset{*this};
  draft_ = &draft;
  if (pool == nullptr) {
    for (int layer = 0; layer < shape_.n_layer; ++layer) end_step(layer, cache, seq);
    return;
  }
  pool->parallel_for(shape_.n_layer, 1, [&](int64_t begin, int64_t end) {
    for (int64_t layer = begin; layer < end; ++layer) end_step(int(layer), cache, seq);
  });
}

void EvictionPolicy::before_compact(int, int, const Head&, std::span<const int32_t>, const KvCache&, SeqId) {}

void EvictionPolicy::after_compact(int, KvCache&, SeqId) {}

bool EvictionPolicy::append_slots(int layer, int h, KvCache& cache, SeqId seq, std::span<const int32_t> positions,
                                  const uint16_t* k_rows, const uint16_t* v_rows, std::span<const int32_t> last,
                                  std::span<const int32_t> mri) {
  const int32_t count = int32_t(positions.size());
  if (count == 0) return true;
  if (last.size() != positions.size() || mri.size() != positions.size()) {
    throw Error(ErrorCode::kInternal, "policy " + config_.name + ": append_slots with mismatched state");
  }
  if (!cache.reserve_head(seq, layer, h, count)) return false;
  const size_t row = size_t(shape_.head_dim);
  for (int32_t i = 0; i < count; ++i) {
    cache.append(seq, layer, h, positions[size_t(i)], k_rows + size_t(i) * row, v_rows + size_t(i) * row);
  }
  Head& hd = head(layer, h);
  const size_t n = size_t(hd.n + count);
  if (needs_.last_mri) {
    hd.last.insert(hd.last.end(), last.begin(), last.end());
    hd.mri.insert(hd.mri.end(), mri.begin(), mri.end());
  }
  if (needs_.attn_sum) hd.attn.resize(n, 0.0f);
  if (needs_.slot_score) hd.score.resize(n, 0.0f);
  if (needs_.hits) hd.hits.resize(n, 0);
  hd.n = int32_t(n);
  point_stats(hd);
  slots_ += count;
  return true;
}

void EvictionPolicy::keep_top(const float* scores, int32_t n_candidates, int32_t n, int32_t k,
                              std::vector<int32_t>& keep, std::vector<int32_t>& index) {
  const int32_t lead = std::min(kept_prompt_len(), n_candidates);
  k = std::clamp(k, lead, n_candidates);
  keep.resize(size_t(k + (n - n_candidates)));
  index.resize(size_t(n_candidates - lead));
  for (int32_t s = 0; s < lead; ++s) keep[size_t(s)] = s;
  cpu::top_k_slots(scores + lead, n_candidates - lead, k - lead, keep.data() + lead, index.data());
  for (int32_t i = lead; i < k; ++i) keep[size_t(i)] += lead;
  for (int32_t s = n_candidates; s < n; ++s) keep[size_t(k + s - n_candidates)] = s;
}

std::vector<std::pair<int32_t, const float*>> EvictionPolicy::recent_queries(const Head& h) const {
  std::vector<std::pair<int32_t, const float*>> kept;  // at most keep_queries entries
  const size_t stride = size_t(queries_per_head()) * size_t(shape_.head_dim);
  for (size_t i = 0; i < h.query_pos.size(); ++i) {
    if (h.query_pos[i] >= 0) kept.emplace_back(h.query_pos[i], h.queries.data() + i * stride);
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

int32_t EvictionPolicy::recent_query_probs(const Head& h, const cpu::KvPages& kv, std::vector<float>& probs) const {
  return query_probs(recent_queries(h), kv, probs);
}

int32_t EvictionPolicy::query_probs(std::span<const std::pair<int32_t, const float*>> kept, const cpu::KvPages& kv,
                                    std::vector<float>& probs) const {
  const int qph = queries_per_head();
  const size_t row = size_t(kv.n_slots);
  probs.resize(kept.size() * size_t(qph) * row);
  for (size_t i = 0; i < kept.size(); ++i) {
    cpu::attention_probs(kept[i].second, qph, shape_.head_dim, kv, kept[i].first, shape_.attn_scale,
                         probs.data() + i * size_t(qph) * row);
  }
  return int32_t(kept.size()) * qph;
}

void EvictionPolicy::keep_by_pooled_attention(std::span<const std::pair<int32_t, const float*>> queries,
                                              int32_t newest, int32_t k, int kernel, const Head& h,
                                              const cpu::KvPages& kv, Scratch& s, std::vector<int32_t>& keep) {
  const int32_t n_candidates = h.n - newest;
  const int32_t rows = query_probs(queries, kv, s.probs);
  s.scores.assign(size_t(n_candidates), 0.0f);
  for (int32_t r = 0; r < rows; ++r) {
    const float* p = s.probs.data() + size_t(r) * size_t(h.n);
    for (int32_t i = 0; i < n_candidates; ++i) s.scores[size_t(i)] += p[i];
  }
  if (rows > 0) {
    for (float& v : s.scores) v /= float(rows);
  }
  s.pooled.resize(size_t(n_candidates));
  cpu::max_pool1d(s.scores.data(), n_candidates, kernel, s.pooled.data());
  keep_top(s.pooled.data(), n_candidates, h.n, k, keep, s.index);
}

nlohmann::json EvictionPolicy::slot_state(int layer, int h) const {
  const Head& hd = heads_[size_t(layer) * size_t(heads_per_layer_) + size_t(h)];
  nlohmann::json j = nlohmann::json::object();
  if (needs_.last_mri) {
    j["last"] = hd.last;
    j["mri"] = hd.mri;
  }
  if (needs_.attn_sum) j["attn"] = hd.attn;
  if (needs_.slot_score) j["score"] = hd.score;
  return j;
}

const std::map<std::string, PolicyFactory>& policy_factories() {
  static const std::map<std::string, PolicyFactory> factories = {
      {"full", make_full_policy},       {"lazy", make_lazy_policy},   {"lazy+tiers", make_lazy_tiers_policy},
      {"streaming", make_streaming_policy}, {"h2o", make_h2o_policy}, {"tova", make_tova_policy},
      {"snapkv", make_snapkv_policy},   {"rkv", make_rkv_policy},     {"raas", make_raas_policy},
      {"caote", make_caote_policy},     {"obcache", make_obcache_policy}, {"vase", make_vase_policy},
      {"triattention", make_triattention_policy}, {"laq", make_laq_policy},   {"skipkv", make_skipkv_policy},
      {"trimkv", make_trimkv_policy},       {"epicache", make_epicache_policy},
  };
  return factories;
}

std::string policy_unavailable(const std::string& name, const PolicyShape& shape) {
  using Check = std::string (*)(const PolicyShape&);
  static const std::map<std::string, Check> checks = {{"triattention", triattention_unavailable},
                                                       {"skipkv", skipkv_unavailable},
                                                       {"trimkv", trimkv_unavailable},
                                                       {"epicache", epicache_unavailable}};
  const auto it = checks.find(name);
  return it == checks.end() ? std::string() : it->second(shape);
}

std::map<std::string, std::string> unavailable_policies(const PolicyShape& shape) {
  std::map<std::string, std::string> out;
  for (const PolicyInfo& p : policy_catalog()) {
    if (std::string why = policy_unavailable(p.name, shape); !why.empty()) out[p.name] = std::move(why);
  }
  return out;
}

std::unique_ptr<EvictionPolicy> make_policy(const PolicyConfig& config, const PolicyShape& shape) {
  const auto it = policy_factories().find(config.name);
  if (it == policy_factories().end()) {
    throw Error(ErrorCode::kInvalidArgument, "unknown eviction policy '" + config.name + "'");
  }
  // (What the model lacks, each factory checks: policy_unavailable.)
  if (std::string why = prompt_refusal(config, shape.prompt_len - shape.resumed_tokens); !why.empty()) {
    throw Error(ErrorCode::kInvalidArgument, why);
  }
  return it->second(config, shape);
}

}  // namespace lazykv
