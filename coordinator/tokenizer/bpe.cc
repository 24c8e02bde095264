#include "coordinator/tokenizer/bpe.h"

#include <algorithm>
#include <functional>

#include "coordinator/tokenizer/byte_level.h"

namespace lazykv {

BpeMerger::BpeMerger(const TokenIdMap& token_ids, const std::vector<std::string>& merges,
                     int32_t unk_id)
    : unk_id_(unk_id) {
  for (unsigned b = 0; b < 256; ++b) {
    const auto it = token_ids.find(byte_level::byte_to_text(static_cast<unsigned char>(b)));
    byte_token_[b] = it == token_ids.end() ? -1 : it->second;
  }
  merges_.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& merge = merges[rank];
    // Search from 1: a part is never empty, and the split is at the first space.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) continue;
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right = std::string_view(merge).substr(space + 1);
    merged.assign(left);
    merged.append(right);
    const auto left_it = token_ids.find(left);
    const auto right_it = token_ids.find(right);
    const auto merged_it = token_ids.find(merged);
    if (left_it == token_ids.end() || right_it == token_ids.end() || merged_it == token_ids.end()) {
      continue;
    }
    // The first (highest-priority) occurrence of a pair wins.
    merges_.try_emplace(pair_key(left_it->second, right_it->second),
                        MergeResult{static_cast<int32_t>(rank), merged_it->second});
  }
}

void BpeMerger::push_candidate(Scratch& scratch, int32_t pos) const {
  const Scratch::Symbol& left = scratch.symbols[pos];
  if (left.next < 0) return;
  const Scratch::Symbol& right = scratch.symbols[left.next];
  if (left.id < 0 || right.id < 0) return;
  const auto it = merges_.find(pair_key(left.id, right.id));
  if (it == merges_.end()) return;
  scratch.heap.push_back({it->second.rank, pos, left.id, right.id, it->second.merged_id});
  std::push_heap(scratch.heap.begin(), scratch.heap.end(), std::greater<>{});
}

void BpeMerger::merge(std::string_view piece, Scratch& scratch, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    const int32_t id = byte_token_[static_cast<unsigned char>(piece[0])];
    if (id >= 0) out.push_back(id);
    else if (unk_id_ >= 0) out.push_back(unk_id_);
    return;
  }

  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.clear();
  heap.clear();
  const auto n = static_cast<int32_t>(piece.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back({byte_token_[static_cast<unsigned char>(piece[i])], i - 1,
                       i + 1 < n ? i + 1 : -1, true});
  }
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(scratch, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const Scratch::Candidate candidate = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = symbols[candidate.pos];
    // Stale when either side changed since the candidate was pushed: a merge
    // always changes a symbol's id (the merged token is longer).
    if (!left.alive || left.id != candidate.left_id || left.next < 0) continue;
    Scratch::Symbol& right = symbols[left.next];
    if (right.id != candidate.right_id) continue;

    left.id = candidate.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = candidate.pos;
    if (left.prev >= 0) push_candidate(scratch, left.prev);
    push_candidate(scratch, candidate.pos);
  }

  for (int32_t pos = 0; pos >= 0; pos = symbols[pos].next) {
    const int32_t id = symbols[pos].id;
    if (id >= 0) out.push_back(id);
    else if (unk_id_ >= 0) out.push_back(unk_id_);
  }
}

}  // namespace lazykv
