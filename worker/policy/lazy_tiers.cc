// `lazy+tiers`: LazyEviction (lazy.cc, the same update, schedule and score)
// whose evicted tokens are not all lost. Semantics, per KV head:
//
// Demotion. At an eviction step, the evicted slots with an observed
// recurrence (mri > 0: the token has regained attention at least once, so
// it may again) are gathered into one block: [count] K rows then [count] V
// rows in the tier row format (Q8_0 or f16, worker/tiers/tier_row_format.h),
// demoted through the process's TierMover. Their metadata (position, last
// hit, mri), the block's key bounds (per-dimension min and max of K) and a
// 4-bit sketch of each K row within those bounds (kernels/cpu/key_sketch.h)
// stay here. Slots with mri = 0 are dropped as in lazy. A promoted slot's
// bytes stay in its block while it is resident: evicted again, it is a
// candidate of that block again and nothing moves.
//
// Promotion, at eviction step t (t mod W = 0), within `promote` slots:
//   (a) schedule: a demoted slot is due when its next recurrence
//       last + mri falls in [t - W, t + W);
//   (b) probe (probe = 1): with the current query q, a demoted slot is
//       promoted when its logit reaches the hit level ln max(alpha, 1/C) + lse,
//       where lse is the log-sum-exp of q over the residents (the softmax
//       probability it would get is then about >= alpha, and >= 1/C).
// Probe candidates rank first (by logit margin), then due slots (by how
// close their recurrence is). Promoted slots join the cache at the end of
// the slot table with their restored (last, mri) and displace the
// lowest-scored residents: that step keeps C - W - P residents, so the
// cache holds C slots after it, as in lazy.
//
// Fetching. `lead` decode steps before eviction step t (at most W), with
// that step's query, the rows whose sketch bound (Quest's upper bound
// sum_d max(q_d a_d, q_d b_d) over the row's cells) reaches the hit level,
// then the rows due at t, are requested: at most `fetch` per head, one
// request per block naming its rows, and only those rows travel. At step t
// they are the candidates. A step waits only for rows requested for it that
// are still in flight (a transfer slower than `lead` decode steps), so
// decisions never depend on transfer timing. Fetched rows not promoted are
// released after the step.
//
// Without tiers (none configured reachable, or the kvstore died) nothing is
// demoted or promoted and the policy evicts exactly like lazy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <unordered_map>

#include "common/fp16.h"
#include "kernels/cpu/eviction.h"
#include "kernels/cpu/key_sketch.h"
#include "worker/policy/policies.h"
#include "worker/tiers/tier_mover.h"
#include "worker/tiers/tier_row_format.h"

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
        lead_(config.get_int("lead")),
        row_format_(shape.head_dim, config.get_int("q8") != 0),
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
      const bool evicting = t % window_ == 0;
      const bool tiered = mover_->available() && !ht.blocks.empty();
      int32_t promoted = 0;
      if (tiered && evicting) promoted = promote_arrived(layer, int(h), hd, ht, cache, seq, t);
      const int32_t lead = std::min(lead_, window_);
      if (tiered && (t + lead) % window_ == 0) {
        request_rows(ht, make_probe(layer, int(h), hd, cache, seq), t + lead, lead);
      }
      if (!evicting || hd.n + promoted <= budget_) continue;
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
      if (restore_stored(ht, positions[size_t(i)], hd.last[size_t(i)], hd.mri[size_t(i)])) continue;
      if (hd.mri[size_t(i)] > 0) demote.push_back(i);
    }
    if (!demote.empty() && mover_->available()) demote_slots(layer, h, hd, demote, cache, seq);
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
          b.resident[size_t(slot)] = 1;
          ht.stored[b.positions[size_t(slot)]] = {b.id, slot};
        }
        ht.promoted.insert(p.positions.begin(), p.positions.end());
        promoted_slots_ += int64_t(p.positions.size());
        promoted_bytes_ += int64_t(p.positions.size() * 2 * row_format_.row_bytes());
      }
      p = Pending{};
      // A block stays stored until the sequence ends: each of its rows is a
      // candidate or resident (and back to candidate when evicted again).
      // Lost (its fetch failed) or superseded blocks are forgotten, and so
      // are their resident rows (demoted anew if evicted again).
      const auto forgotten = [](const Demoted& b) { return b.lost || b.superseded; };
      for (const Demoted& b : ht.blocks) {
        if (!forgotten(b)) continue;
        for (size_t j = 0; j < b.positions.size(); ++j) {
          if (b.resident[j]) ht.stored.erase(b.positions[j]);
        }
        if (!b.superseded) mover_->drop(b.key);
      }
      std::erase_if(ht.blocks, forgotten);
    }
  }

 private:
  // The demoted slots' K and V rows, in the tier row format, as one block;
  // their statistics, the block's key box and the rows' sketches stay here.
  void demote_slots(int layer, int h, const Head& hd, std::span<const int32_t> demote, const KvCache& cache,
                    SeqId seq) {
    HeadTiers& ht = tiers(layer, h);
    const std::span<const int32_t> positions = cache.positions(seq, layer, h);
    const size_t dim = size_t(shape().head_dim);
    const size_t count = demote.size();
    const size_t row_bytes = row_format_.row_bytes();
    std::vector<uint16_t> k_rows(count * dim), v_row(dim);
    std::vector<uint8_t> bytes(2 * count * row_bytes);
    Demoted block;
    block.key_min.assign(dim, std::numeric_limits<float>::infinity());
    block.key_max.assign(dim, -std::numeric_limits<float>::infinity());
    int64_t soonest = std::numeric_limits<int64_t>::max();
    for (size_t j = 0; j < count; ++j) {
      const size_t slot = size_t(demote[j]);
      cache.read_slot(seq, layer, h, int32_t(slot), &k_rows[j * dim], v_row.data());
      row_format_.encode(&k_rows[j * dim], &bytes[j * row_bytes]);
      row_format_.encode(v_row.data(), &bytes[(count + j) * row_bytes]);
      for (size_t d = 0; d < dim; ++d) {
        const float x = fp16_to_fp32(k_rows[j * dim + d]);
        block.key_min[d] = std::min(block.key_min[d], x);
        block.key_max[d] = std::max(block.key_max[d], x);
      }
      block.positions.push_back(positions[slot]);
      block.last.push_back(hd.last[slot]);
      block.mri.push_back(hd.mri[slot]);
      soonest = std::min<int64_t>(soonest, std::max<int64_t>(0, int64_t(hd.last[slot]) + hd.mri[slot] - step()));
    }
    block.sketch.resize(count * cpu::key_sketch_bytes(int(dim)));
    cpu::encode_key_sketch(k_rows.data(), int32_t(count), int(dim), block.key_min.data(), block.key_max.data(),
                           block.sketch.data());
    block.alive.assign(count, 1);
    block.resident.assign(count, 0);
    block.key = kvstore::BlockKey{fingerprint_, sequence_, uint32_t(layer), uint32_t(h),
                                  uint32_t(*std::min_element(block.positions.begin(), block.positions.end())),
                                  uint32_t(count)};
    block.id = ht.next_block_id++;
    const size_t block_bytes = bytes.size();
    if (!mover_->put(block.key, std::move(bytes), kvstore::BlockHint{uint64_t(soonest)})) return;
    // A block with the same key (same first position and count: its rows
    // were forgotten with a lost block and evicted again) was just
    // overwritten in the store: its record goes at after_compact (indices of
    // this step's promotions must stay valid until then), without dropping
    // the key.
    for (Demoted& old : ht.blocks) old.superseded |= old.key == block.key;
    demoted_slots_ += int64_t(count);
    demoted_bytes_ += int64_t(block_bytes);
    ht.blocks.push_back(std::move(block));
  }

  struct Demoted {
    kvstore::BlockKey key;
    uint64_t id = 0;                       // increasing in ht.blocks' order
    std::vector<int32_t> positions, last, mri;
    std::vector<uint8_t> alive;            // stored and evicted: a promotion candidate
    // Promoted and in the cache: its bytes stay stored, so evicting it
    // again costs no transfer (restore_stored).
    std::vector<uint8_t> resident;
    bool lost = false;                     // its fetch failed: the store no longer has it
    std::vector<float> key_min, key_max;   // [head_dim]
    std::vector<uint8_t> sketch;           // [count][key_sketch_bytes(head_dim)]
    std::shared_ptr<tiers::Fetch> fetch;   // rows in flight or arrived
    std::vector<uint32_t> fetched_rows;    // which rows `fetch` brings, ascending
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
    struct StoredRow {
      uint64_t block_id;
      int32_t slot;
    };
    std::unordered_map<int32_t, StoredRow> stored;  // resident rows by position
    uint64_t next_block_id = 0;
  };
  struct Candidate {
    double rank;  // lower first
    size_t block;
    int32_t slot;     // row in the block
    size_t fetched;   // row in the fetched bytes
  };

  HeadTiers& tiers(int layer, int h) { return heads_[size_t(layer) * size_t(shape().n_head_kv) + size_t(h)]; }

  // A promoted row evicted again whose block still holds its bytes becomes a
  // promotion candidate again, with its current statistics, and nothing moves.
  bool restore_stored(HeadTiers& ht, int32_t position, int32_t last, int32_t mri) {
    const auto it = ht.stored.find(position);
    if (it == ht.stored.end()) return false;
    const HeadTiers::StoredRow row = it->second;
    ht.stored.erase(it);
    const auto b = std::lower_bound(ht.blocks.begin(), ht.blocks.end(), row.block_id,
                                    [](const Demoted& block, uint64_t id) { return block.id < id; });
    if (b == ht.blocks.end() || b->id != row.block_id || b->lost || b->superseded) return false;
    const size_t j = size_t(row.slot);
    b->resident[j] = 0;
    b->alive[j] = 1;
    b->last[j] = last;
    b->mri[j] = mri;
    return true;
  }

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

  // The probe at one step: the group's current queries and, per query, the
  // logit a demoted key must reach to count as a hit (ln alpha over the
  // log-sum-exp of the query against the residents). Empty when not probing.
  struct Probe {
    std::vector<float> query;  // [queries_per_head][head_dim]
    std::vector<float> level;  // [queries_per_head]
    bool on() const { return !level.empty(); }
  };

  Probe make_probe(int layer, int h, const Head& hd, const KvCache& cache, SeqId seq) const {
    Probe probe;
    const auto queries = recent_queries(hd);
    if (!probe_ || queries.empty()) return probe;
    const int dim = shape().head_dim;
    const int qph = queries_per_head();
    probe.query.assign(queries.back().second, queries.back().second + size_t(qph) * size_t(dim));
    const cpu::KvPages kv = cache.view(seq, layer, h);
    std::vector<float> logits(size_t(qph) * size_t(kv.n_slots));
    cpu::attention_logits(probe.query.data(), qph, dim, kv, std::numeric_limits<int32_t>::max(), shape().attn_scale,
                          logits.data());
    probe.level.resize(size_t(qph));
    for (int r = 0; r < qph; ++r) {
      const float* row = logits.data() + size_t(r) * size_t(kv.n_slots);
      const float top = *std::max_element(row, row + kv.n_slots);
      double sum = 0;
      for (int32_t i = 0; i < kv.n_slots; ++i) sum += std::exp(double(row[i]) - top);
      probe.level[size_t(r)] = float(double(top) + std::log(sum) + log_probe_level_);
    }
    return probe;
  }

  // Best margin over the hit level across the group's queries, of the logit
  // that `dot(query row r)` gives.
  template <typename Dot>
  float best_margin(const Probe& probe, Dot dot) const {
    float best = -std::numeric_limits<float>::infinity();
    for (size_t r = 0; r < probe.level.size(); ++r) best = std::max(best, dot(r) * shape().attn_scale - probe.level[r]);
    return best;
  }

  // Chooses this step's promotions from the arrived rows into ht.pending.
  // Returns the number promoted.
  int32_t promote_arrived(int layer, int h, const Head& hd, HeadTiers& ht, const KvCache& cache, SeqId seq,
                          int32_t t) {
    const Probe probe = make_probe(layer, h, hd, cache, seq);
    std::vector<Candidate> candidates = arrived_candidates(ht, probe, t);
    const int32_t room = std::max(0, std::min(promote_, budget_ - window_ - kept_prompt_len()));
    if (int32_t(candidates.size()) > room) candidates.resize(size_t(room));
    const size_t dim = size_t(shape().head_dim);
    const size_t row_bytes = row_format_.row_bytes();
    Pending& p = ht.pending;
    for (const Candidate& c : candidates) {
      const Demoted& b = ht.blocks[c.block];
      const uint8_t* k_row = b.fetch->bytes().data() + c.fetched * row_bytes;
      const uint8_t* v_row = k_row + b.fetched_rows.size() * row_bytes;
      p.positions.push_back(b.positions[size_t(c.slot)]);
      p.last.push_back(b.last[size_t(c.slot)]);
      p.mri.push_back(b.mri[size_t(c.slot)]);
      p.k.resize(p.k.size() + dim);
      p.v.resize(p.v.size() + dim);
      row_format_.decode(k_row, &p.k[p.k.size() - dim]);
      row_format_.decode(v_row, &p.v[p.v.size() - dim]);
      p.from.emplace_back(c.block, c.slot);
    }
    // Arrived bytes are not kept past this step (the promoted rows were copied).
    for (Demoted& b : ht.blocks) {
      b.fetch.reset();
      b.fetched_rows.clear();
    }
    return int32_t(p.positions.size());
  }

  // The rows requested `lead` steps ago for this step, ranked: probe hits
  // first (by margin), then due rows (closest recurrence first). They
  // normally arrived long ago; if not, the step waits for them, so the
  // decisions never depend on transfer timing (the same tokens in process
  // and through a kvstore).
  std::vector<Candidate> arrived_candidates(HeadTiers& ht, const Probe& probe, int32_t t) {
    const int dim = shape().head_dim;
    std::vector<Candidate> candidates;
    std::vector<uint16_t> key_f16(static_cast<size_t>(dim));
    std::vector<float> key(static_cast<size_t>(dim));
    for (size_t bi = 0; bi < ht.blocks.size(); ++bi) {
      Demoted& b = ht.blocks[bi];
      if (!b.fetch || b.superseded) continue;
      if (!b.fetch->ready()) {
        b.fetch->wait();
        ++fetch_waits_;
      }
      if (b.fetch->state() != tiers::Fetch::State::kDone) {
        b.lost = true;  // its slots are gone for good
        --fetched_blocks_;
        fetched_bytes_ -= int64_t(2 * b.fetched_rows.size() * row_format_.row_bytes());
        continue;
      }
      for (size_t i = 0; i < b.fetched_rows.size(); ++i) {
        const int32_t j = int32_t(b.fetched_rows[i]);
        if (!b.alive[size_t(j)]) continue;
        if (probe.on()) {
          row_format_.decode(b.fetch->bytes().data() + i * row_format_.row_bytes(), key_f16.data());
          for (int d = 0; d < dim; ++d) key[size_t(d)] = fp16_to_fp32(key_f16[size_t(d)]);
          const float m = best_margin(probe, [&](size_t r) {
            const float* q = probe.query.data() + r * size_t(dim);
            float dot = 0;
            for (int d = 0; d < dim; ++d) dot += q[d] * key[size_t(d)];
            return dot;
          });
          if (m >= 0) {
            candidates.push_back({-double(m), bi, j, i});
            continue;
          }
        }
        if (due(b, j, t - window_, t + window_)) {
          const int64_t next = int64_t(b.last[size_t(j)]) + b.mri[size_t(j)];
          candidates.push_back({1e9 + double(std::llabs(next - t)), bi, j, i});
        }
      }
    }
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      return a.rank != b.rank ? a.rank < b.rank : (a.block != b.block ? a.block < b.block : a.slot < b.slot);
    });
    return candidates;
  }

  struct Wanted {
    double rank;  // lower first
    size_t block;
    uint32_t row;
    bool operator<(const Wanted& o) const {
      return rank != o.rank ? rank < o.rank : (block != o.block ? block < o.block : row < o.row);
    }
  };

  // Requests for eviction step `target`, made with this step's probe, at
  // most `fetch` rows per head, one request per block naming its rows.
  void request_rows(HeadTiers& ht, const Probe& probe, int32_t target, int32_t lead) {
    std::vector<Wanted> wanted = rank_rows(ht, probe, target);
    if (int32_t(wanted.size()) > fetch_) {
      std::nth_element(wanted.begin(), wanted.begin() + fetch_, wanted.end());
      wanted.resize(size_t(fetch_));
    }
    std::sort(wanted.begin(), wanted.end(),
              [](const Wanted& a, const Wanted& b) { return a.block != b.block ? a.block < b.block : a.row < b.row; });
    const uint32_t row_bytes = uint32_t(row_format_.row_bytes());
    for (size_t i = 0; i < wanted.size();) {
      const size_t block = wanted[i].block;
      kvstore::RowSelection selection{{}, row_bytes};
      for (; i < wanted.size() && wanted[i].block == block; ++i) selection.rows.push_back(wanted[i].row);
      Demoted& b = ht.blocks[block];
      b.fetched_rows = selection.rows;
      const int64_t bytes = int64_t(selection.bytes());
      b.fetch = mover_->fetch_rows(b.key, std::move(selection), kvstore::BlockHint{uint64_t(lead)});
      if (!b.fetch) {
        b.fetched_rows.clear();
        continue;
      }
      // Counted when asked for, so rows requested for a step the sequence
      // never reaches count too; a fetch that fails is taken back.
      ++fetched_blocks_;
      fetched_bytes_ += bytes;
    }
  }

  // The candidate rows for eviction step `target`: those whose sketch bound
  // reaches the hit level (by margin), then those due at the target
  // (closest recurrence first). Rows this step already promotes are not.
  std::vector<Wanted> rank_rows(const HeadTiers& ht, const Probe& probe, int32_t target) const {
    const int dim = shape().head_dim;
    std::set<std::pair<size_t, int32_t>> promoting(ht.pending.from.begin(), ht.pending.from.end());
    std::vector<Wanted> wanted;
    std::vector<float> table(size_t(dim) * cpu::kKeySketchCells), margins, bounds;
    for (size_t bi = 0; bi < ht.blocks.size(); ++bi) {
      const Demoted& b = ht.blocks[bi];
      if (b.lost || b.superseded) continue;
      const int32_t n = int32_t(b.positions.size());
      margins.assign(size_t(n), -std::numeric_limits<float>::infinity());
      if (probe.on() && block_may_hit(b, probe)) {
        bounds.resize(size_t(n));
        for (size_t r = 0; r < probe.level.size(); ++r) {  // the best margin over the group's queries
          cpu::key_sketch_table(probe.query.data() + r * size_t(dim), dim, b.key_min.data(), b.key_max.data(),
                                table.data());
          cpu::key_sketch_bounds(table.data(), b.sketch.data(), n, dim, bounds.data());
          for (int32_t j = 0; j < n; ++j) {
            margins[size_t(j)] =
                std::max(margins[size_t(j)], bounds[size_t(j)] * shape().attn_scale - probe.level[r]);
          }
        }
      }
      for (int32_t j = 0; j < n; ++j) {
        if (!b.alive[size_t(j)] || promoting.count({bi, j}) > 0) continue;
        if (margins[size_t(j)] >= 0) {
          wanted.push_back({-double(margins[size_t(j)]), bi, uint32_t(j)});
        } else if (due(b, j, target - window_, target + window_)) {
          const int64_t next = int64_t(b.last[size_t(j)]) + b.mri[size_t(j)];
          wanted.push_back({1e9 + double(std::llabs(next - target)), bi, uint32_t(j)});
        }
      }
    }
    return wanted;
  }

  // Quest's bound over the whole block: no row can reach the level if it does not.
  bool block_may_hit(const Demoted& b, const Probe& probe) const {
    const int dim = shape().head_dim;
    return best_margin(probe, [&](size_t r) {
             const float* q = probe.query.data() + r * size_t(dim);
             float bound = 0;
             for (int d = 0; d < dim; ++d) {
               bound += std::max(q[d] * b.key_min[size_t(d)], q[d] * b.key_max[size_t(d)]);
             }
             return bound;
           }) >= 0;
  }

  const int32_t budget_, window_, promote_, fetch_, lead_;
  const tiers::TierRowFormat row_format_;
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
