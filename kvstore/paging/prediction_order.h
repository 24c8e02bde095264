// The eviction order of follow-prediction: cached pages by predicted next
// use, furthest first. Shared by follow-prediction and Guard (which keeps only
// its unguarded pages here), so that both break ties the same way and Guard's
// decisions are follow-prediction's while no page is guarded.
//
// An indexed binary max-heap: O(log n) set/erase, O(1) furthest. Heap slots
// carry their keys (comparisons stay in one array) and a page's heap position
// sits in a flat node array, so a sift costs no hashing; only the page ->
// node lookup hashes, once per operation.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kvstore/paging/replacement_policy.h"

namespace lazykv::paging {

class PredictionOrder {
 public:
  // Inserts `page` or moves it to its new place. `request_seq` numbers the
  // page's latest request (unique per request); among equal predictions
  // (typically kNever) the page requested longest ago goes first, as LRU
  // would choose.
  void set(PageId page, uint64_t predicted_next_use, uint64_t request_seq);
  // Returns whether the page was there.
  bool erase(PageId page);
  bool contains(PageId page) const { return node_of_.contains(page); }
  size_t size() const { return heap_.size(); }
  // The page with the furthest predicted next use other than `excluded`;
  // nullopt if there is none. O(1).
  std::optional<PageId> furthest(PageId excluded) const;

 private:
  struct Slot {
    uint64_t predicted_next_use;
    uint64_t request_seq;
    uint32_t node;
  };
  struct Node {
    PageId page;
    uint32_t slot;
  };
  // Whether `a` is evicted before `b`.
  static bool before(const Slot& a, const Slot& b) {
    if (a.predicted_next_use != b.predicted_next_use) {
      return a.predicted_next_use > b.predicted_next_use;
    }
    return a.request_seq < b.request_seq;
  }
  void place(uint32_t index, const Slot& slot);
  void sift_up(uint32_t index);
  void sift_down(uint32_t index);

  std::vector<Slot> heap_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_nodes_;
  std::unordered_map<PageId, uint32_t> node_of_;
};

}  // namespace lazykv::paging
