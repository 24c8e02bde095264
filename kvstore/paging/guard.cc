// Guard (Chen, Zhao, Zhang, Tang, Wang, Deng, "Robustifying Learning-Augmented
// Caching Efficiently without Compromising 1-Consistency", arXiv 2507.16242,
// NeurIPS 2025) wrapped around follow-prediction.
//
// Source of the rule. The paper's algorithm section was not reachable from
// here (only its abstract and introduction); the rule below is the one of the
// authors' public reference implementation (GuardAlgorithm in their
// cache-coliseum benchmark, default settings: no relaxation), re-derived and
// written from scratch, restated for a caller-driven cache without a fixed k.
//
// Phases (the marking definition). A page is "marked" once it is requested in
// the current phase (a page fetched in the phase was requested, so it is
// marked). A new phase starts when a victim is needed and every cached page is
// marked (equivalently: no unrequested old page is left). At that moment every
// cached page becomes "old and unrequested" (the set U), all guards are lifted
// and the set E of pages evicted in the phase is emptied. The first victim
// ever needed starts the first phase.
//
// Evictions. To choose a victim for the missing page p:
//   * if p is in E (follow-prediction evicted it earlier in this phase and it
//     came back: a prediction error), evict a page drawn uniformly at random
//     (from the seed) from U, and fetch p "guarded": follow-prediction may not
//     evict it again until the phase ends;
//   * otherwise evict what follow-prediction would among the unguarded cached
//     pages: the furthest predicted next use, ties to the page requested
//     longest ago.
// Every victim joins E and leaves U; a hit on an old page removes it from U.
// When several victims are needed for one miss (blocks differ in size), each
// is chosen by the same rule; if U runs empty meanwhile, the next call starts
// a new phase and p is no longer an error there.
// erase() removes a page from every set without putting it in E: it left for
// a reason outside the policy, so its return says nothing about predictions.
//
// Why 1-consistency (identical decisions to follow-prediction when every
// prediction is exact). Guard differs from follow-prediction only after an
// error. Suppose follow-prediction evicts q at time t with an exact prediction
// T < kNever. Every page u in U at time t is cached and unguarded (guarded
// pages were fetched in the phase, so they are not old), so u was a candidate:
// its exact next request comes before T (distinct times; kNever ties cannot
// return). Before T each such u is requested (a hit, leaving U) or leaves the
// cache (leaving U). So when q misses at T, U is empty: its first victim call
// starts a new phase, which empties E, and q is not an error. No error ever
// happens, no page is ever guarded, and every victim is follow-prediction's,
// including its tie-breaking (both use PredictionOrder and the same request
// numbering).
//
// Why 2·H(k−1)+2 robustness (unit pages, cache of k; the paper's theorem, in
// expectation over the seed, up to an additive constant). In a phase with ℓ
// new pages (not cached at its start), misses are either first misses on new
// pages (ℓ of them; each such miss that needs a victim takes it from
// follow-prediction) or errors (a page of E returning). A guarded page stays
// cached to the end of the phase, so each page errs at most once per phase.
// Errors on pages follow-prediction evicted number at most ℓ; errors on pages
// evicted at random form chains as in the randomized marking algorithm, whose
// random choices among the unrequested old pages bound their expected number
// by ℓ·H(k−1). With the marking lower bound OPT ≥ (Σ ℓ)/2 over all phases
// this gives (2 + 2·H(k−1))·OPT + O(k).
//
// Cost. O(1) expected extra work per request on top of follow-prediction:
// hash lookups, a swap-remove in U, one random draw. Starting a phase lists
// every cached page in U, but each must leave U (by a hit, an eviction or an
// erase) before the next phase can start, so it is amortized O(1); lifting g
// guards costs O(g log n), paid for by the g errors that set them.
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvstore/paging/pending_miss.h"
#include "kvstore/paging/prediction_order.h"
#include "kvstore/paging/replacement_policy.h"
#include "kvstore/paging/seeded_random.h"

namespace lazykv::paging {
namespace {

constexpr size_t kNotOld = static_cast<size_t>(-1);

class Guard final : public ReplacementPolicy {
 public:
  explicit Guard(uint64_t seed) : random_(seed) {}

  std::string_view name() const override { return "guard"; }

  bool request(PageId page, uint64_t /*now*/, uint64_t predicted_next_use) override {
    const uint64_t seq = next_seq_++;
    auto it = cached_.find(page);
    if (it == cached_.end()) {
      pending_.set(page, predicted_next_use, seq);
      return false;
    }
    CachedPage& state = it->second;
    state.predicted_next_use = predicted_next_use;
    state.request_seq = seq;
    if (!state.guarded) unguarded_.set(page, predicted_next_use, seq);
    if (state.old_slot != kNotOld) remove_from_old(state);
    return true;
  }

  void insert(PageId page) override {
    pending_.take(page, cached_.contains(page));
    const bool guarded = incoming_guarded_ && guarded_page_ == page;
    incoming_guarded_ = false;
    cached_.emplace(page, CachedPage{pending_.predicted_next_use, pending_.request_seq, guarded,
                                     kNotOld});
    if (!guarded) unguarded_.set(page, pending_.predicted_next_use, pending_.request_seq);
  }

  PageId choose_victim(PageId incoming) override {
    if (unrequested_old_.empty()) start_phase();
    PageId victim;
    if (evicted_in_phase_.contains(incoming)) {
      victim = random_unrequested_old(incoming);
      incoming_guarded_ = true;
      guarded_page_ = incoming;
    } else {
      const auto furthest = unguarded_.furthest(incoming);
      if (!furthest) throw_no_victim(incoming);
      victim = *furthest;
    }
    remove_cached(victim);
    evicted_in_phase_.insert(victim);
    return victim;
  }

  void erase(PageId page) override {
    if (cached_.contains(page)) remove_cached(page);
  }

  bool contains(PageId page) const override { return cached_.contains(page); }
  size_t size() const override { return cached_.size(); }

 private:
  struct CachedPage {
    uint64_t predicted_next_use;
    uint64_t request_seq;
    bool guarded;     // fetched after an error in this phase: not follow-prediction's to evict
    size_t old_slot;  // index in unrequested_old_, or kNotOld
  };

  void start_phase() {
    evicted_in_phase_.clear();
    incoming_guarded_ = false;
    unrequested_old_.clear();
    unrequested_old_.reserve(cached_.size());
    for (auto& [page, state] : cached_) {
      state.old_slot = unrequested_old_.size();
      unrequested_old_.push_back(page);
      if (state.guarded) {
        state.guarded = false;
        unguarded_.set(page, state.predicted_next_use, state.request_seq);
      }
    }
  }

  PageId random_unrequested_old(PageId incoming) {
    // U is not empty here (the phase just started, or it would have), and the
    // incoming page is not cached, so it is not in U; the skip only guards
    // against a caller breaking that precondition.
    const size_t n = unrequested_old_.size();
    size_t index = random_.below(n);
    if (unrequested_old_[index] == incoming) {
      if (n == 1) throw_no_victim(incoming);
      index = (index + 1) % n;
    }
    return unrequested_old_[index];
  }

  void remove_from_old(CachedPage& state) {
    const size_t slot = state.old_slot;
    const PageId last = unrequested_old_.back();
    unrequested_old_[slot] = last;
    cached_.at(last).old_slot = slot;
    unrequested_old_.pop_back();
    state.old_slot = kNotOld;
  }

  void remove_cached(PageId page) {
    auto it = cached_.find(page);
    if (it->second.old_slot != kNotOld) remove_from_old(it->second);
    if (!it->second.guarded) unguarded_.erase(page);
    cached_.erase(it);
  }

  std::unordered_map<PageId, CachedPage> cached_;
  PredictionOrder unguarded_;               // follow-prediction over the unguarded pages
  std::vector<PageId> unrequested_old_;     // U: cached at the phase start, not requested since
  std::unordered_set<PageId> evicted_in_phase_;  // E
  SeededRandom random_;
  PendingMiss pending_;
  bool incoming_guarded_ = false;  // the pending miss was an error: insert it guarded
  PageId guarded_page_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> make_guard(uint64_t seed) { return std::make_unique<Guard>(seed); }

}  // namespace lazykv::paging
