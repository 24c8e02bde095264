// Belady's offline optimum and the perfect predictor it needs.
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvstore/paging/replacement_policy.h"

namespace lazykv::paging {

std::vector<uint64_t> perfect_predictions(std::span<const PageId> requests) {
  std::vector<uint64_t> next_use(requests.size(), kNever);
  std::unordered_map<PageId, uint64_t> later_request;
  later_request.reserve(requests.size());
  for (size_t i = requests.size(); i-- > 0;) {
    auto [it, inserted] = later_request.try_emplace(requests[i], i);
    if (!inserted) {
      next_use[i] = it->second;
      it->second = i;
    }
  }
  return next_use;
}

size_t belady_misses(std::span<const PageId> requests, size_t k) {
  if (k == 0) return requests.size();
  const std::vector<uint64_t> next_use = perfect_predictions(requests);
  // Cached page -> its next use. The heap holds (next use, page) and may keep
  // stale entries of pages since requested again or evicted; an entry is
  // current only if it matches the map. O(n log n) in all.
  std::unordered_map<PageId, uint64_t> cached;
  cached.reserve(k * 2);
  std::priority_queue<std::pair<uint64_t, PageId>> furthest;
  size_t misses = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PageId page = requests[i];
    auto it = cached.find(page);
    if (it == cached.end()) {
      ++misses;
      if (cached.size() == k) {
        for (;;) {
          const auto [when, candidate] = furthest.top();
          furthest.pop();
          auto current = cached.find(candidate);
          if (current != cached.end() && current->second == when) {
            cached.erase(current);
            break;
          }
        }
      }
      it = cached.emplace(page, 0).first;
    }
    it->second = next_use[i];
    furthest.emplace(next_use[i], page);
  }
  return misses;
}

}  // namespace lazykv::paging
