// Replays a request sequence through a policy with a cache of k unit pages.
#include <string>

#include "common/error.h"
#include "kvstore/paging/replacement_policy.h"

namespace lazykv::paging {

size_t simulate_misses(ReplacementPolicy& policy, std::span<const PageId> requests,
                       std::span<const uint64_t> predictions, size_t k) {
  if (predictions.size() != requests.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "simulate_misses: " + std::to_string(requests.size()) + " requests but " +
                    std::to_string(predictions.size()) + " predictions");
  }
  size_t misses = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (policy.request(requests[i], i, predictions[i])) continue;
    ++misses;
    if (k == 0) continue;  // nothing fits: every request misses
    while (policy.size() >= k) policy.choose_victim(requests[i]);
    policy.insert(requests[i]);
  }
  return misses;
}

}  // namespace lazykv::paging
