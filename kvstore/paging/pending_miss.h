// The request that missed and awaits insert(): the policies learn a page's
// prediction in request() but cache it only in insert(), after the caller
// has made room.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.h"
#include "kvstore/paging/replacement_policy.h"

namespace lazykv::paging {

struct PendingMiss {
  bool valid = false;
  PageId page = 0;
  uint64_t predicted_next_use = kNever;
  uint64_t request_seq = 0;

  void set(PageId missed, uint64_t predicted, uint64_t seq) {
    valid = true;
    page = missed;
    predicted_next_use = predicted;
    request_seq = seq;
  }
  // Checks that insert(`inserted`) follows a miss on that page and consumes
  // the miss; throws Error(kInvalidArgument) otherwise.
  void take(PageId inserted, bool already_cached) {
    if (already_cached) {
      throw Error(ErrorCode::kInvalidArgument,
                  "replacement policy: insert of page " + std::to_string(inserted) +
                      ", which is already cached");
    }
    if (!valid || page != inserted) {
      throw Error(ErrorCode::kInvalidArgument,
                  "replacement policy: insert of page " + std::to_string(inserted) +
                      ", which is not the page of the last request that missed");
    }
    valid = false;
  }
};

[[noreturn]] inline void throw_no_victim(PageId incoming) {
  throw Error(ErrorCode::kInvalidArgument,
              "replacement policy: no cached page other than page " +
                  std::to_string(incoming) + " to evict");
}

}  // namespace lazykv::paging
