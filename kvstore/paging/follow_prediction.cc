// Follow-prediction (BlindOracle): evict the cached page whose predicted next
// use is furthest; ties (equal predictions, typically kNever) go to the page
// requested longest ago. O(log n) per operation.
#include "kvstore/paging/pending_miss.h"
#include "kvstore/paging/prediction_order.h"
#include "kvstore/paging/replacement_policy.h"

namespace lazykv::paging {
namespace {

class FollowPrediction final : public ReplacementPolicy {
 public:
  std::string_view name() const override { return "follow-prediction"; }

  bool request(PageId page, uint64_t /*now*/, uint64_t predicted_next_use) override {
    const uint64_t seq = next_seq_++;
    if (order_.contains(page)) {
      order_.set(page, predicted_next_use, seq);
      return true;
    }
    pending_.set(page, predicted_next_use, seq);
    return false;
  }

  void insert(PageId page) override {
    pending_.take(page, order_.contains(page));
    order_.set(page, pending_.predicted_next_use, pending_.request_seq);
  }

  PageId choose_victim(PageId incoming) override {
    const auto victim = order_.furthest(incoming);
    if (!victim) throw_no_victim(incoming);
    order_.erase(*victim);
    return *victim;
  }

  void erase(PageId page) override { order_.erase(page); }
  bool contains(PageId page) const override { return order_.contains(page); }
  size_t size() const override { return order_.size(); }

 private:
  PredictionOrder order_;
  PendingMiss pending_;
  uint64_t next_seq_ = 0;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> make_follow_prediction() {
  return std::make_unique<FollowPrediction>();
}

}  // namespace lazykv::paging
