// Request sequences and a recording replay loop shared by the paging tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kvstore/paging/replacement_policy.h"

namespace lazykv::paging::testing {

// Zipf-like popularity over `universe` pages (exponent s), shuffled ids.
inline std::vector<PageId> zipf_requests(size_t n, size_t universe, double s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> cumulative(universe);
  double total = 0;
  for (size_t r = 0; r < universe; ++r) {
    total += 1.0 / std::pow(static_cast<double>(r + 1), s);
    cumulative[r] = total;
  }
  std::vector<PageId> ids(universe);
  for (size_t r = 0; r < universe; ++r) ids[r] = 1000 + r * 7;
  std::shuffle(ids.begin(), ids.end(), rng);
  std::uniform_real_distribution<double> unit(0.0, total);
  std::vector<PageId> requests(n);
  for (auto& page : requests) {
    const double x = unit(rng);
    const size_t rank = std::lower_bound(cumulative.begin(), cumulative.end(), x) - cumulative.begin();
    page = ids[std::min(rank, universe - 1)];
  }
  return requests;
}

// 0, 1, ..., loop_len-1, 0, 1, ... (a scan that LRU handles worst).
inline std::vector<PageId> looping_requests(size_t n, size_t loop_len) {
  std::vector<PageId> requests(n);
  for (size_t i = 0; i < n; ++i) requests[i] = i % loop_len;
  return requests;
}

inline std::vector<PageId> uniform_requests(size_t n, size_t universe, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<PageId> requests(n);
  for (auto& page : requests) page = rng() % universe;
  return requests;
}

// Loops over a working set that shifts every `phase_len` requests, with
// random repeats: phases of locality as in a reasoning workload.
inline std::vector<PageId> shifting_loops(size_t n, size_t set_size, size_t phase_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<PageId> requests(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t base = (i / phase_len) * (set_size / 2);
    requests[i] = base + (rng() % 4 == 0 ? rng() % set_size : i % set_size);
  }
  return requests;
}

inline double harmonic(size_t k) {
  double h = 0;
  for (size_t i = 1; i <= k; ++i) h += 1.0 / static_cast<double>(i);
  return h;
}

// What a policy did at one request.
struct Step {
  bool hit = false;
  std::vector<PageId> victims;
  bool operator==(const Step&) const = default;
};

// Replays `requests` like simulate_misses, but with pages of size
// size_of(page) in a cache of `capacity` units, optionally erasing a cached
// page after some requests (erase_every > 0), and records every decision.
// Checks on the way that no victim is the incoming page.
template <typename SizeOf>
std::vector<Step> replay(ReplacementPolicy& policy, std::span<const PageId> requests,
                         std::span<const uint64_t> predictions, size_t capacity, SizeOf size_of,
                         size_t erase_every = 0, bool* victim_was_incoming = nullptr) {
  std::vector<Step> steps(requests.size());
  std::vector<PageId> cached;  // for the erases: a deterministic pick
  size_t used = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PageId page = requests[i];
    Step& step = steps[i];
    step.hit = policy.request(page, i, predictions[i]);
    if (!step.hit) {
      while (used + size_of(page) > capacity) {
        const PageId victim = policy.choose_victim(page);
        if (victim == page && victim_was_incoming != nullptr) *victim_was_incoming = true;
        step.victims.push_back(victim);
        used -= size_of(victim);
        std::erase(cached, victim);
      }
      policy.insert(page);
      used += size_of(page);
      cached.push_back(page);
    }
    if (erase_every != 0 && i % erase_every == erase_every - 1 && !cached.empty()) {
      const PageId gone = cached[(i * 2654435761u) % cached.size()];
      policy.erase(gone);
      std::erase(cached, gone);
      used -= size_of(gone);
    }
  }
  return steps;
}

inline size_t unit_size(PageId) { return 1; }

inline size_t count_misses(const std::vector<Step>& steps) {
  size_t misses = 0;
  for (const Step& s : steps) misses += s.hit ? 0 : 1;
  return misses;
}

}  // namespace lazykv::paging::testing
