#include "kvstore/paging/prediction_order.h"

namespace lazykv::paging {

void PredictionOrder::place(uint32_t index, const Slot& slot) {
  heap_[index] = slot;
  nodes_[slot.node].slot = index;
}

void PredictionOrder::sift_up(uint32_t index) {
  const Slot moving = heap_[index];
  while (index > 0) {
    const uint32_t parent = (index - 1) / 2;
    if (!before(moving, heap_[parent])) break;
    place(index, heap_[parent]);
    index = parent;
  }
  place(index, moving);
}

void PredictionOrder::sift_down(uint32_t index) {
  const Slot moving = heap_[index];
  const auto n = static_cast<uint32_t>(heap_.size());
  for (;;) {
    uint32_t child = 2 * index + 1;
    if (child >= n) break;
    if (child + 1 < n && before(heap_[child + 1], heap_[child])) ++child;
    if (!before(heap_[child], moving)) break;
    place(index, heap_[child]);
    index = child;
  }
  place(index, moving);
}

void PredictionOrder::set(PageId page, uint64_t predicted_next_use, uint64_t request_seq) {
  auto [it, inserted] = node_of_.try_emplace(page, 0);
  if (inserted) {
    uint32_t node;
    if (free_nodes_.empty()) {
      node = static_cast<uint32_t>(nodes_.size());
      nodes_.push_back({page, 0});
    } else {
      node = free_nodes_.back();
      free_nodes_.pop_back();
      nodes_[node].page = page;
    }
    it->second = node;
    heap_.push_back({predicted_next_use, request_seq, node});
    nodes_[node].slot = static_cast<uint32_t>(heap_.size() - 1);
    sift_up(nodes_[node].slot);
    return;
  }
  const uint32_t index = nodes_[it->second].slot;
  const Slot old = heap_[index];
  heap_[index].predicted_next_use = predicted_next_use;
  heap_[index].request_seq = request_seq;
  if (before(heap_[index], old)) {
    sift_up(index);
  } else {
    sift_down(index);
  }
}

bool PredictionOrder::erase(PageId page) {
  auto it = node_of_.find(page);
  if (it == node_of_.end()) return false;
  const uint32_t node = it->second;
  const uint32_t index = nodes_[node].slot;
  node_of_.erase(it);
  free_nodes_.push_back(node);
  const Slot last = heap_.back();
  heap_.pop_back();
  if (index == heap_.size()) return true;  // it was the last slot
  place(index, last);
  if (index > 0 && before(last, heap_[(index - 1) / 2])) {
    sift_up(index);
  } else {
    sift_down(index);
  }
  return true;
}

std::optional<PageId> PredictionOrder::furthest(PageId excluded) const {
  if (heap_.empty()) return std::nullopt;
  const PageId top = nodes_[heap_[0].node].page;
  if (top != excluded) return top;
  // The runner-up of a binary heap is the better of the root's children.
  if (heap_.size() == 1) return std::nullopt;
  uint32_t child = 1;
  if (heap_.size() > 2 && before(heap_[2], heap_[1])) child = 2;
  return nodes_[heap_[child].node].page;
}

}  // namespace lazykv::paging
