#include <string>

#include "common/error.h"
#include "kvstore/paging/replacement_policy.h"

namespace lazykv::paging {

std::unique_ptr<ReplacementPolicy> make_replacement_policy(std::string_view name, uint64_t seed) {
  if (name == "guard") return make_guard(seed);
  if (name == "follow-prediction") return make_follow_prediction();
  if (name == "lru") return make_lru();
  throw Error(ErrorCode::kInvalidArgument,
              "unknown replacement policy '" + std::string(name) +
                  "' (expected guard, follow-prediction or lru)");
}

}  // namespace lazykv::paging
