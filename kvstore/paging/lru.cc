// Least recently used: the prediction-free baseline. O(1) per operation.
#include <iterator>
#include <list>
#include <unordered_map>

#include "kvstore/paging/pending_miss.h"
#include "kvstore/paging/replacement_policy.h"

namespace lazykv::paging {
namespace {

class Lru final : public ReplacementPolicy {
 public:
  std::string_view name() const override { return "lru"; }

  bool request(PageId page, uint64_t /*now*/, uint64_t predicted_next_use) override {
    auto it = where_.find(page);
    if (it != where_.end()) {
      recency_.splice(recency_.begin(), recency_, it->second);
      return true;
    }
    pending_.set(page, predicted_next_use, 0);
    return false;
  }

  void insert(PageId page) override {
    pending_.take(page, where_.contains(page));
    recency_.push_front(page);
    where_.emplace(page, recency_.begin());
  }

  PageId choose_victim(PageId incoming) override {
    if (recency_.empty()) throw_no_victim(incoming);
    auto it = std::prev(recency_.end());
    if (*it == incoming) {
      if (it == recency_.begin()) throw_no_victim(incoming);
      --it;
    }
    const PageId victim = *it;
    where_.erase(victim);
    recency_.erase(it);
    return victim;
  }

  void erase(PageId page) override {
    auto it = where_.find(page);
    if (it == where_.end()) return;
    recency_.erase(it->second);
    where_.erase(it);
  }

  bool contains(PageId page) const override { return where_.contains(page); }
  size_t size() const override { return where_.size(); }

 private:
  std::list<PageId> recency_;  // most recently requested first
  std::unordered_map<PageId, std::list<PageId>::iterator> where_;
  PendingMiss pending_;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> make_lru() { return std::make_unique<Lru>(); }

}  // namespace lazykv::paging
