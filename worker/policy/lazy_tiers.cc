// `lazy+tiers`: LazyEviction (lazy.cc, the same update, schedule and score)
// whose evicted tokens are not all lost. Semantics, per KV head:
//
// Demotion. At an eviction step, the evicted slots with an observed
// recurrence (mri > 0: the token has regained attention at least once, so
// it may again) are gathered into one block [count][head_dim] K rows then V
// rows, f16, and demoted through the process's TierMover. Their metadata
// (position, last hit, mri) and the block's key bounds (per-dimension min
// and max of K, for the probe) stay here. Slots with mri = 0 are dropped as
// in lazy.
//
// Promotion, at eviction step t (t mod W = 0), within `promote` slots:
//   (a) schedule: a demoted slot is due when its next recurrence
//       last + mri falls in [t - W, t + W);
//   (b) probe (probe = 1): with the current query q, a demoted slot is
//       promoted when its logit reaches the hit level ln(alpha) + lse, where
//       lse is the log-sum-exp of q over the residents (the softmax
//       probability it would get is then about >= alpha).
// Probe candidates rank first (by logit margin), then due slots (by how
// close their recurrence is). Promoted slots join the cache at the end of
// the slot table with their restored (last, mri) and displace the
// lowest-scored residents: that step keeps C - W - P residents, so the
// cache holds C slots after it, as in lazy.
//
// Overlap. A block is fetched one window ahead: at step t the blocks with a
// slot due by t + 2W, or whose key bound (Quest's upper bound
// sum_d max(q_d min_d, q_d max_d)) reaches the hit level, are requested
// (at most `fetch` per head); at step t + W they are the candidates. A step
// waits only for a block requested for it that is still in flight (a
// transfer slower than W decode steps), so decisions never depend on
// transfer timing. Fetched bytes not promoted are released after the step.
//
// Without tiers (none configured reachable, or the kvstore died) nothing is
// demoted or promoted and the policy evicts exactly like lazy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "common/fp16.h"
#include "kernels/cpu/eviction.h"
#include "worker/policy/policies.h"
#include "worker/tiers/tier_mover.h"

namespace lazykv {
namespace {

class LazyTiersPolicy final : public EvictionPolicy {
 public:
  LazyTiersPolicy(const PolicyConfig& config, const PolicyShape& shape)
      : EvictionPolicy(config, shape, shape.n_head_kv,
                       Needs{.hits = true, .alpha = float(config.get("alpha")), .last_mri = true, .keep_queries = 1}),
        budget_(config.get_int("budget")),
        window_(config.get_int("window")),
        promote_(config.get_int("promote")),
        fetch_(config.get_int("fetch")),
        probe_(config.get_int("probe") != 0),
        log_probe_level_(std::log(std::max(double(config.get("alpha")), 1.0 / double(config.get_int("budget"))))),
        mover_(tiers::process_tiers()),
        fingerprint_(tiers::process_fingerprint()),
        sequence_(tiers::next_tier_sequence()),
        heads_(size_t(shape.n_layer) * size_t(shape.n_head_kv)) {}

  ~LazyTiersPolicy() override {
    if (demoted_slots_ > 0) mover_->drop_sequence(fingerprint_, sequence_);
  }

  TierCounters tier_counters() const override {
    TierCounters c;
    c.demoted_slots = demoted_slots_;
    c.demoted_bytes = demoted_bytes_;
    c.promoted_slots = promoted_slots_;
    c.promoted_bytes = promoted_bytes_;
    c.promotion_hits = promotion_hits_;
    c.fetched_blocks = fetched_blocks_;
    c.fetched_bytes = fetched_bytes_;
    c.fetch_waits = fetch_waits_;
    c.tiers_available = mover_->available();
    return c;
  }

 protected:
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override {
    const int32_t t = step();
    if (t < 1) return;
    Scratch& s = scratch(layer);
    for (size_t h = 0; h < heads.size(); ++h) {
      Head& hd = heads[h];
      HeadTiers& ht = tiers(layer, int(h));
      count_promotion_hits(hd, ht, cache.positions(seq, layer, int(h)));
      cpu::lazy_update(hd.hits.data(), hd.last.data(), hd.mri.data(), hd.n, t);
      if (t % window_ != 0) continue;
      int32_t promoted = 0;
      if (mover_->available() && !ht.blocks.empty()) promoted = plan_tiers(layer, int(h), hd, ht, cache, seq, t);
      if (hd.n + promoted <= budget_) continue;
      const int32_t n_candidates = hd.n - window_;
      s.scores.resize(size_t(n_candidates));
      cpu::lazy_scores(hd.last.data(), hd.mri.data(), n_candidates, t, s.scores.data());
      keep_top(s.scores.data(), n_candidates, hd.n, budget_ - window_ - promoted, keep[h], s.index);
    }
  }

  void before_compact(int layer, int h, const Head& hd, std::span<const int32_t> keep, const KvCache& cache,
                      SeqId seq) override {
    HeadTiers& ht = tiers(layer, h);
    const std::span<const int32_t> positions = cache.positions(seq, layer, h);
    std::vector<int32_t> demote;
    size_t k = 0;
    for (int32_t i = 0; i < hd.n; ++i) {
      if (k < keep.size() && keep[k] == i) {
        ++k;
        continue;
      }
      ht.promoted.erase(positions[size_t(i)]);  // left again without a hit
      if (hd.mri[size_t(i)] > 0) demote.push_back(i);
    }
    if (demote.empty() || !mover_->available()) return;

    const int dim = shape().head_dim;
    const size_t count = demote.size();
    Demoted block;
    block.positions.reserve(count);
    std::vector<uint8_t> bytes(count * size_t(dim) * 2 * sizeof(uint16_t));
    uint16_t* k_rows = reinterpret_cast<uint16_t*>(bytes.data());
    uint16_t* v_rows = k_rows + count * size_t(dim);
    block.key_min.assign(size_t(dim), std::numeric_limits<float>::infinity());
    block.key_max.assign(size_t(dim), -std::numeric_limits<float>::infinity());
    int64_t soonest = std::numeric_limits<int64_t>::max();
    const int32_t t = step();
    for (size_t j = 0; j < count; ++j) {
      const int32_t slot = demote[j];
      cache.read_slot(seq, layer, h, slot, k_rows + j * size_t(dim), v_rows + j * size_t(dim));
      for (int d = 0; d < dim; ++d) {
        const float x = fp16_to_fp32(k_rows[j * size_t(dim) + size_t(d)]);
        block.key_min[size_t(d)] = std::min(block.key_min[size_t(d)], x);
        block.key_max[size_t(d)] = std::max(block.key_max[size_t(d)], x);
      }
      block.positions.push_back(positions[size_t(slot)]);
      block.last.push_back(hd.last[size_t(slot)]);
      block.mri.push_back(hd.mri[size_t(slot)]);
      soonest = std::min<int64_t>(soonest, std::max<int64_t>(0, int64_t(hd.last[size_t(slot)]) + hd.mri[size_t(slot)] - t));
    }
    block.alive.assign(count, 1);
    block.alive_count = int32_t(count);
    block.key = kvstore::BlockKey{fingerprint_, sequence_, uint32_t(layer), uint32_t(h),
                                  uint32_t(*std::min_element(block.positions.begin(), block.positions.end())),
                                  uint32_t(count)};
    block.bytes = bytes.size();
    if (!mover_->put(block.key, std::move(bytes), kvstore::BlockHint{uint64_t(soonest)})) return;
    // A block with the same key (same first position and count, after a
    // promotion and a second eviction) was just overwritten in the store:
    // its record goes (at after_compact: indices of this step's promotions
    // must stay valid until then), without dropping the key.
    for (Demoted& old : ht.blocks) {
      if (old.key == block.key) {
        old.alive_count = 0;
        old.superseded = true;
      }
    }
    demoted_slots_ += int64_t(count);
    demoted_bytes_ += int64_t(block.bytes);
    ht.blocks.push_back(std::move(block));
  }

  void after_compact(int layer, KvCache& cache, SeqId seq) override {
    for (int h = 0; h < shape().n_head_kv; ++h) {
      HeadTiers& ht = tiers(layer, h);
      Pending& p = ht.pending;
      if (!p.positions.empty() &&
          append_slots(layer, h, cache, seq, p.positions, p.k.data(), p.v.data(), p.last, p.mri)) {
        for (const auto& [block, slot] : p.from) {
          Demoted& b = ht.blocks[block];
          if (b.alive[size_t(slot)] == 0) continue;
          b.alive[size_t(slot)] = 0;
          b.alive_count = std::max(0, b.alive_count - 1);
        }
        ht.promoted.insert(p.positions.begin(), p.positions.end());
        promoted_slots_ += int64_t(p.positions.size());
        promoted_bytes_ += int64_t(p.positions.size() * size_t(shape().head_dim) * 2 * sizeof(uint16_t));
      }
      p = Pending{};
      // Blocks fully promoted, lost (their fetch failed) or superseded are forgotten.
      for (const Demoted& b : ht.blocks) {
        if (b.alive_count == 0 && !b.superseded) mover_->drop(b.key);
      }
      std::erase_if(ht.blocks, [](const Demoted& b) { return b.alive_count == 0; });
    }
  }

 private:
  struct Demoted {
    kvstore::BlockKey key;
    size_t bytes = 0;
    std::vector<int32_t> positions, last, mri;
    std::vector<uint8_t> alive;
    int32_t alive_count = 0;
    std::vector<float> key_min, key_max;   // [head_dim]
    std::shared_ptr<tiers::Fetch> fetch;   // in flight or arrived
    bool superseded = false;               // a newer block took its key
  };
  // Slots chosen at select(), appended at after_compact().
  struct Pending {
    std::vector<int32_t> positions, last, mri;
    std::vector<uint16_t> k, v;                 // [n][head_dim]
    std::vector<std::pair<size_t, int32_t>> from;  // (block, slot in block)
  };
  struct HeadTiers {
    std::vector<Demoted> blocks;
    Pending pending;
    std::set<int32_t> promoted;  // positions promoted and not yet hit
  };
  struct Candidate {
    double rank;  // lower first
    size_t block;
    int32_t slot;
  };

  HeadTiers& tiers(int layer, int h) { return heads_[size_t(layer) * size_t(shape().n_head_kv) + size_t(h)]; }

  void count_promotion_hits(const Head& hd, HeadTiers& ht, std::span<const int32_t> positions) {
    if (ht.promoted.empty()) return;
    for (int32_t i = 0; i < hd.n; ++i) {
      if (hd.hits[size_t(i)] && ht.promoted.erase(positions[size_t(i)]) > 0) ++promotion_hits_;
    }
  }

  bool due(const Demoted& b, int32_t slot, int64_t from, int64_t to) const {
    const int64_t next = int64_t(b.last[size_t(slot)]) + b.mri[size_t(slot)];
    return b.mri[size_t(slot)] > 0 && next >= from && next < to;
  }

  // Chooses this step's promotions from arrived blocks into ht.pending and
  // requests the blocks the next step may need. Returns the number promoted.
  int32_t plan_tiers(int layer, int h, const Head& hd, HeadTiers& ht, const KvCache& cache, SeqId seq, int32_t t) {
    const int dim = shape().head_dim;
    const int qph = queries_per_head();
    // The current query and its hit level over the residents.
    std::vector<float> query, level;
    if (probe_) {
      const auto queries = recent_queries(hd);
      if (!queries.empty()) {
        query.assign(queries.back().second, queries.back().second + size_t(qph) * size_t(dim));
        const cpu::KvPages kv = cache.view(seq, layer, h);
        std::vector<float> logits(size_t(qph) * size_t(kv.n_slots));
        cpu::attention_logits(query.data(), qph, dim, kv, std::numeric_limits<int32_t>::max(),
                              shape().attn_scale, logits.data());
        level.resize(size_t(qph));
        for (int r = 0; r < qph; ++r) {
          const float* row = logits.data() + size_t(r) * size_t(kv.n_slots);
          const float top = *std::max_element(row, row + kv.n_slots);
          double sum = 0;
          for (int32_t i = 0; i < kv.n_slots; ++i) sum += std::exp(double(row[i]) - top);
          level[size_t(r)] = float(double(top) + std::log(sum) + log_probe_level_);
        }
      }
    }
    // Best margin of a key over the hit level, across the group's queries.
    const auto margin = [&](const float* key) {
      float best = -std::numeric_limits<float>::infinity();
      for (int r = 0; r < qph; ++r) {
        const float* q = query.data() + size_t(r) * size_t(dim);
        float dot = 0;
        for (int d = 0; d < dim; ++d) dot += q[d] * key[d];
        best = std::max(best, dot * shape().attn_scale - level[size_t(r)]);
      }
      return best;
    };
    const auto bound_margin = [&](const Demoted& b) {
      float best = -std::numeric_limits<float>::infinity();
      for (int r = 0; r < qph; ++r) {
        const float* q = query.data() + size_t(r) * size_t(dim);
        float bound = 0;
        for (int d = 0; d < dim; ++d) bound += std::max(q[d] * b.key_min[size_t(d)], q[d] * b.key_max[size_t(d)]);
        best = std::max(best, bound * shape().attn_scale - level[size_t(r)]);
      }
      return best;
    };
    const bool probing = !level.empty();

    // (1) Candidates from the blocks requested one window ago for this step.
    // They normally arrived long ago; if not, the step waits for them, so
    // the decisions never depend on transfer timing (the same tokens in
    // process and through a kvstore).
    std::vector<Candidate> candidates;
    std::vector<float> key(static_cast<size_t>(dim));
    for (size_t bi = 0; bi < ht.blocks.size(); ++bi) {
      Demoted& b = ht.blocks[bi];
      if (!b.fetch) continue;
      if (!b.fetch->ready()) {
        b.fetch->wait();
        ++fetch_waits_;
      }
      if (b.fetch->state() != tiers::Fetch::State::kDone) {
        b.alive_count = 0;  // lost: its slots are gone for good
        continue;
      }
      ++fetched_blocks_;
      fetched_bytes_ += int64_t(b.bytes);
      const uint16_t* k_rows = reinterpret_cast<const uint16_t*>(b.fetch->bytes().data());
      for (int32_t j = 0; j < int32_t(b.positions.size()); ++j) {
        if (!b.alive[size_t(j)]) continue;
        if (probing) {
          for (int d = 0; d < dim; ++d) key[size_t(d)] = fp16_to_fp32(k_rows[size_t(j) * size_t(dim) + size_t(d)]);
          const float m = margin(key.data());
          if (m >= 0) {
            candidates.push_back({-double(m), bi, j});
            continue;
          }
        }
        if (due(b, j, t - window_, t + window_)) {
          const int64_t next = int64_t(b.last[size_t(j)]) + b.mri[size_t(j)];
          candidates.push_back({1e9 + double(std::llabs(next - t)), bi, j});
        }
      }
    }
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      return a.rank != b.rank ? a.rank < b.rank : (a.block != b.block ? a.block < b.block : a.slot < b.slot);
    });
    const int32_t room = std::max(0, std::min(promote_, budget_ - window_ - kept_prompt_len()));
    if (int32_t(candidates.size()) > room) candidates.resize(size_t(room));
    Pending& p = ht.pending;
    for (const Candidate& c : candidates) {
      const Demoted& b = ht.blocks[c.block];
      const size_t n = b.positions.size();
      const uint16_t* k_rows = reinterpret_cast<const uint16_t*>(b.fetch->bytes().data());
      const uint16_t* v_rows = k_rows + n * size_t(dim);
      p.positions.push_back(b.positions[size_t(c.slot)]);
      p.last.push_back(b.last[size_t(c.slot)]);
      p.mri.push_back(b.mri[size_t(c.slot)]);
      p.k.insert(p.k.end(), k_rows + size_t(c.slot) * size_t(dim), k_rows + size_t(c.slot + 1) * size_t(dim));
      p.v.insert(p.v.end(), v_rows + size_t(c.slot) * size_t(dim), v_rows + size_t(c.slot + 1) * size_t(dim));
      p.from.emplace_back(c.block, c.slot);
    }
    // Arrived bytes are not kept past this step (the promoted rows were copied).
    for (Demoted& b : ht.blocks) {
      if (b.fetch && b.fetch->ready()) b.fetch.reset();
    }

    // (2) Requests for the next eviction step.
    std::vector<std::pair<double, size_t>> wanted;
    for (size_t bi = 0; bi < ht.blocks.size(); ++bi) {
      const Demoted& b = ht.blocks[bi];
      if (b.fetch || b.alive_count == 0) continue;
      if (probing) {
        const float m = bound_margin(b);
        if (m >= 0) {
          wanted.emplace_back(-double(m), bi);
          continue;
        }
      }
      int64_t soonest = std::numeric_limits<int64_t>::max();
      for (int32_t j = 0; j < int32_t(b.positions.size()); ++j) {
        if (b.alive[size_t(j)] && due(b, j, t, t + 2 * int64_t(window_))) {
          soonest = std::min<int64_t>(soonest, int64_t(b.last[size_t(j)]) + b.mri[size_t(j)]);
        }
      }
      if (soonest != std::numeric_limits<int64_t>::max()) wanted.emplace_back(1e9 + double(soonest - t), bi);
    }
    std::sort(wanted.begin(), wanted.end());
    if (int32_t(wanted.size()) > fetch_) wanted.resize(size_t(fetch_));
    for (const auto& [rank, bi] : wanted) {
      Demoted& b = ht.blocks[bi];
      b.fetch = mover_->fetch(b.key, b.bytes, kvstore::BlockHint{uint64_t(window_)});
    }
    return int32_t(p.positions.size());
  }

  const int32_t budget_, window_, promote_, fetch_;
  const bool probe_;
  const double log_probe_level_;  // ln max(alpha, 1/C): a promoted slot must draw at least a budget slot's share
  std::shared_ptr<tiers::TierMover> mover_;
  const uint64_t fingerprint_, sequence_;
  std::vector<HeadTiers> heads_;  // [n_layer][n_head_kv]
  std::atomic<int64_t> demoted_slots_{0}, demoted_bytes_{0}, promoted_slots_{0}, promoted_bytes_{0},
      promotion_hits_{0}, fetched_blocks_{0}, fetched_bytes_{0}, fetch_waits_{0};
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_lazy_tiers_policy(const PolicyConfig& config, const PolicyShape& shape) {
  return std::make_unique<LazyTiersPolicy>(config, shape);
}

}  // namespace lazykv
