// Replacement policies for the kvstore's host tier, in the paging model: a
// request names a page and carries the predictor's time of that page's next
// request. The tier decides when it is full (its blocks differ in size), so
// the policy never evicts on its own: the caller asks for victims until the
// missing page fits, then inserts it.
//
//   follow-prediction  evict the cached page whose predicted next use is
//                      furthest (Belady's rule on predicted times); optimal
//                      when the predictions are right.
//   guard              Guard (Chen et al., "Robustifying Learning-Augmented
//                      Caching Efficiently without Compromising
//                      1-Consistency"): identical to follow-prediction while
//                      its predictions are right, at most 2·H(k−1)+2 times the
//                      optimum when they are wrong (in expectation over its
//                      seed, plus an additive constant), O(1) extra work per
//                      request.
//   lru                least recently used, the prediction-free baseline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace lazykv::paging {

using PageId = uint64_t;
// A predicted next use that never comes.
inline constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

class ReplacementPolicy {
 public:
  virtual ~ReplacementPolicy() = default;
  virtual std::string_view name() const = 0;

  // A request for `page` at logical time `now` (non-decreasing over calls);
  // `predicted_next_use` is the predictor's time of the page's next request
  // after this one (> now, or kNever). Returns true on a hit. A miss does not
  // insert: the caller makes room with choose_victim(page), then insert(page).
  virtual bool request(PageId page, uint64_t now, uint64_t predicted_next_use) = 0;
  // Inserts the page of the last request, which missed.
  virtual void insert(PageId page) = 0;
  // Chooses a cached page to evict so that `incoming` (the page of the last
  // request, which missed) fits; removes it from the policy and returns it.
  // Precondition: size() > 0.
  virtual PageId choose_victim(PageId incoming) = 0;
  // Removes a page for a reason outside the policy (its sequence was
  // dropped). No effect if the page is not cached.
  virtual void erase(PageId page) = 0;
  virtual bool contains(PageId page) const = 0;
  virtual size_t size() const = 0;
};

std::unique_ptr<ReplacementPolicy> make_follow_prediction();
// Guard around follow-prediction; `seed` drives its random choices.
std::unique_ptr<ReplacementPolicy> make_guard(uint64_t seed);
std::unique_ptr<ReplacementPolicy> make_lru();
// By name: "guard", "follow-prediction", "lru"; Error(kInvalidArgument) otherwise.
std::unique_ptr<ReplacementPolicy> make_replacement_policy(std::string_view name, uint64_t seed);

// Misses of Belady's offline optimum on `requests` with a cache of k pages.
size_t belady_misses(std::span<const PageId> requests, size_t k);
// Misses of `policy` on `requests` with a cache of k pages; request i happens
// at time i and predictions[i] is the predicted time of requests[i]'s next
// request (kNever if none).
size_t simulate_misses(ReplacementPolicy& policy, std::span<const PageId> requests,
                       std::span<const uint64_t> predictions, size_t k);
// The exact next-use times of `requests` (a perfect predictor).
std::vector<uint64_t> perfect_predictions(std::span<const PageId> requests);

}  // namespace lazykv::paging
