#include "worker/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "common/error.h"

namespace lazykv {

KvCache::KvCache(const KvCacheConfig& config)
    : config_(config),
      page_bytes_(size_t(config.page_slots) * config.head_dim * 2 * sizeof(uint16_t)) {
  if (config.n_layer <= 0 || config.n_head_kv <= 0 || config.head_dim <= 0 || config.page_slots <= 0) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: layers, heads, head_dim and page_slots must be positive");
  }
  // Chunk pointers never move, so page pointers may be read while another
  // head takes a page (reserve_head runs concurrently across heads).
  chunks_.reserve(kMaxChunks);
  references_.reserve(kMaxChunks);
  written_flags_.reserve(kMaxChunks);
}

KvCache::~KvCache() = default;

void KvCache::add_sequence(SeqId seq, int heads_per_layer) {
  if (seqs_.count(seq) != 0) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: sequence " + std::to_string(seq) + " already exists");
  }
  if (heads_per_layer == 0) heads_per_layer = config_.n_head_kv;
  if (heads_per_layer < 0 || heads_per_layer % config_.n_head_kv != 0) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: heads per layer " + std::to_string(heads_per_layer) +
                                                 " is not a positive multiple of " + std::to_string(config_.n_head_kv) +
                                                 " KV heads");
  }
  Sequence& s = seqs_[seq];
  s.heads_per_layer = heads_per_layer;
  s.heads.resize(size_t(config_.n_layer) * size_t(heads_per_layer));
  for (HeadTable& h : s.heads) h.max_position = &s.max_position;  // map nodes do not move
}

int KvCache::heads_per_layer(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: unknown sequence " + std::to_string(seq));
  }
  return it->second.heads_per_layer;
}

void KvCache::remove_sequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (HeadTable& h : it->second.heads) {
    for (int32_t p : h.pages) give_page(p);
  }
  seqs_.erase(it);
}

bool KvCache::has_sequence(SeqId seq) const { return seqs_.count(seq) != 0; }

KvCache::HeadTable& KvCache::head(SeqId seq, int layer, int kv_head) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: unknown sequence " + std::to_string(seq));
  }
  const int n_heads = it->second.heads_per_layer;
  if (layer < 0 || layer >= config_.n_layer || kv_head < 0 || kv_head >= n_heads) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: layer " + std::to_string(layer) + ", KV head " +
                                                 std::to_string(kv_head) + " out of range");
  }
  return it->second.heads[size_t(layer) * size_t(n_heads) + size_t(kv_head)];
}

const KvCache::HeadTable& KvCache::head(SeqId seq, int layer, int kv_head) const {
  return const_cast<KvCache*>(this)->head(seq, layer, kv_head);
}

uint16_t* KvCache::page_keys(int32_t page) const {
  uint8_t* base = chunks_[size_t(page) / kPagesPerChunk].get() + size_t(page % kPagesPerChunk) * page_bytes_;
  return reinterpret_cast<uint16_t*>(base);
}

uint16_t* KvCache::page_values(int32_t page) const {
  return page_keys(page) + size_t(config_.page_slots) * config_.head_dim;
}

int32_t KvCache::take_page() {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  return take_page_locked();
}

int32_t KvCache::take_page_locked() {
  if (free_pages_.empty()) {
    if (chunks_.size() == chunks_.capacity()) {
      throw Error(ErrorCode::kOutOfMemory, "kv cache: more than " + std::to_string(kMaxChunks) + " page chunks");
    }
    const int32_t first = int32_t(pool_pages_);
    // Zeroed, so the chunk is resident from the start: the resident set then
    // follows the pool (which never shrinks) rather than creeping up for
    // minutes as decode first touches pages the pool already held, and no
    // page faults land inside the attention kernels.
    chunks_.push_back(std::make_unique<uint8_t[]>(page_bytes_ * kPagesPerChunk));
    references_.push_back(std::make_unique<std::atomic<int32_t>[]>(kPagesPerChunk));  // zeroed
    written_flags_.push_back(std::make_unique<std::atomic<uint8_t>[]>(kPagesPerChunk));  // zeroed
    pool_pages_ += kPagesPerChunk;
    for (int32_t p = int32_t(pool_pages_) - 1; p >= first; --p) free_pages_.push_back(p);
  }
  const int32_t page = free_pages_.back();
  free_pages_.pop_back();
  ++pages_in_use_;
  references(page).store(1, std::memory_order_relaxed);
  return page;
}

std::atomic<int32_t>& KvCache::references(int32_t page) const {
  return references_[size_t(page) / kPagesPerChunk][size_t(page) % kPagesPerChunk];
}

bool KvCache::is_shared(int32_t page) const { return references(page).load(std::memory_order_acquire) > 1; }

int32_t KvCache::page_references(int32_t page) const {
  if (page < 0 || size_t(page) >= pool_pages_) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: page " + std::to_string(page) + " is not in the pool");
  }
  return references(page).load(std::memory_order_acquire);
}

void KvCache::give_page(int32_t page) {
  // A holder that copied this page did so before dropping its reference
  // (acq_rel), so whoever sees the count reach 1 or 0 sees the copy done.
  if (references(page).fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::lock_guard<std::mutex> lock(pool_mutex_);
  free_pages_.push_back(page);
  --pages_in_use_;
}

void KvCache::retain_pages(std::span<const int32_t> pages) {
  for (int32_t p : pages) {  // all checked before any is taken
    if (page_references(p) < 1) throw Error(ErrorCode::kInternal, "kv cache: retain of a free page");
  }
  for (int32_t p : pages) references(p).fetch_add(1, std::memory_order_relaxed);
}

bool KvCache::drop_shared_reference(int32_t page) {
  std::atomic<int32_t>& refs = references(page);
  for (int32_t n = refs.load(std::memory_order_acquire); n > 1;) {
    if (refs.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) return true;
  }
  return false;
}

void KvCache::replace_with_copy(HeadTable& h, size_t index, int32_t copy) {
  const int32_t shared = h.pages[index];
  std::memcpy(page_keys(copy), page_keys(shared), page_bytes_);
  // The other holders may have copied and let go meanwhile: then the page is
  // this head's alone, and the copy goes back (the pool's use does not hang
  // on which head copied first).
  if (!drop_shared_reference(shared)) {
    give_page(copy);
    return;
  }
  h.pages[index] = copy;
  h.key_ptrs[index] = page_keys(copy);
  h.value_ptrs[index] = page_values(copy);
  mark_written(copy);
}

int32_t KvCache::load_page(std::span<const uint8_t> bytes) {
  if (bytes.size() != page_bytes_) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: a page of " + std::to_string(bytes.size()) +
                                                 " bytes where pages are " + std::to_string(page_bytes_));
  }
  int32_t page = -1;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!within_capacity(1)) return -1;
    page = take_page_locked();
  }
  std::memcpy(page_keys(page), bytes.data(), bytes.size());
  mark_written(page);
  return page;
}

void KvCache::release_pages(std::span<const int32_t> pages) {
  for (int32_t p : pages) give_page(p);
}

void KvCache::make_private(HeadTable& h, size_t index) {
  if (is_shared(h.pages[index])) replace_with_copy(h, index, take_page());
}

int32_t KvCache::shared_tail(const HeadTable& h) const {
  const size_t slots = h.positions.size();
  if (slots % config_.page_slots == 0) return -1;  // the next append starts a page of its own
  const int32_t tail = h.pages[slots / config_.page_slots];
  return is_shared(tail) ? tail : -1;
}

void KvCache::adopt_pages(SeqId seq, int layer, int kv_head, std::span<const int32_t> pages, int32_t n_slots) {
  HeadTable& h = head(seq, layer, kv_head);
  if (!h.pages.empty() || !h.positions.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: pages adopted into a head that holds slots already");
  }
  const int32_t whole = int32_t(pages.size()) * config_.page_slots;
  if (n_slots < 0) n_slots = whole;
  if (n_slots > whole || n_slots <= whole - config_.page_slots) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: " + std::to_string(n_slots) + " slots adopted in " +
                                                 std::to_string(pages.size()) + " pages");
  }
  retain_pages(pages);
  for (int32_t p : pages) {
    h.pages.push_back(p);
    h.key_ptrs.push_back(page_keys(p));
    h.value_ptrs.push_back(page_values(p));
  }
  const int32_t n = n_slots;
  h.positions.resize(size_t(n));
  for (int32_t s = 0; s < n; ++s) h.positions[size_t(s)] = s;
  for (int32_t seen = h.max_position->load(std::memory_order_relaxed);
       n - 1 > seen && !h.max_position->compare_exchange_weak(seen, n - 1, std::memory_order_relaxed);) {
  }
}

void KvCache::track_written_pages() { track_written_ = true; }

void KvCache::mark_written(int32_t page) {
  if (!track_written_) return;
  std::atomic<uint8_t>& flag = written_flags_[size_t(page) / kPagesPerChunk][size_t(page) % kPagesPerChunk];
  if (flag.load(std::memory_order_relaxed) != 0 || flag.exchange(1) != 0) return;
  std::lock_guard<std::mutex> lock(written_mutex_);
  written_.push_back(page);
}

size_t KvCache::written_page_count() {
  std::lock_guard<std::mutex> lock(written_mutex_);
  return written_.size();
}

void KvCache::take_written_pages(std::vector<int32_t>& pages) {
  std::lock_guard<std::mutex> lock(written_mutex_);
  pages.clear();
  pages.swap(written_);
  for (int32_t p : pages) written_flags_[size_t(p) / kPagesPerChunk][size_t(p) % kPagesPerChunk].store(0);
}

std::span<const int32_t> KvCache::page_ids(SeqId seq, int layer, int kv_head) const {
  return head(seq, layer, kv_head).pages;
}

void KvCache::reserve(SeqId seq, int n_new) {
  if (n_new < 0) throw Error(ErrorCode::kInvalidArgument, "kv cache: reserve of a negative count");
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: unknown sequence " + std::to_string(seq));
  }
  size_t needed = 0;
  for (const HeadTable& h : it->second.heads) {
    const size_t slots = h.positions.size() + size_t(n_new);
    const size_t pages = (slots + config_.page_slots - 1) / config_.page_slots;
    if (pages > h.pages.size()) needed += pages - h.pages.size();
    if (n_new > 0 && shared_tail(h) >= 0) ++needed;  // its private copy
  }
  if (!within_capacity(needed)) {
    throw Error(ErrorCode::kOutOfMemory,
                "kv cache: " + std::to_string(needed * page_bytes_) + " more bytes needed, " +
                    std::to_string(config_.capacity_bytes - std::min(config_.capacity_bytes, pages_in_use_ * page_bytes_)) +
                    " of " +
                    std::to_string(config_.capacity_bytes) + " free");
  }
  for (HeadTable& h : it->second.heads) {
    const size_t slots = h.positions.size() + size_t(n_new);
    if (n_new > 0 && shared_tail(h) >= 0) make_private(h, h.positions.size() / config_.page_slots);
    while (h.pages.size() * config_.page_slots < slots) {
      const int32_t p = take_page();
      h.pages.push_back(p);
      h.key_ptrs.push_back(page_keys(p));
      h.value_ptrs.push_back(page_values(p));
    }
    h.positions.reserve(slots);
  }
}

bool KvCache::reserve_head(SeqId seq, int layer, int kv_head, int n_new) {
  HeadTable& h = head(seq, layer, kv_head);
  const size_t slots = h.positions.size() + size_t(std::max(n_new, 0));
  const size_t pages = (slots + config_.page_slots - 1) / config_.page_slots;
  const bool copy_tail = n_new > 0 && shared_tail(h) >= 0;
  if (pages <= h.pages.size() && !copy_tail) return true;
  const size_t needed = (pages > h.pages.size() ? pages - h.pages.size() : 0) + (copy_tail ? 1 : 0);
  std::vector<int32_t> taken;
  {
    // Check and take under one lock: heads reserving at once never overshoot.
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!within_capacity(needed)) return false;
    const size_t chunks_needed = needed > free_pages_.size()
                                     ? (needed - free_pages_.size() + kPagesPerChunk - 1) / kPagesPerChunk
                                     : 0;
    if (chunks_.size() + chunks_needed > chunks_.capacity()) return false;
    while (taken.size() < needed) taken.push_back(take_page_locked());
  }
  if (copy_tail) {  // the last page taken becomes the tail's private copy
    const int32_t copy = taken.back();
    taken.pop_back();
    replace_with_copy(h, h.positions.size() / config_.page_slots, copy);
  }
  for (int32_t p : taken) {
    h.pages.push_back(p);
    h.key_ptrs.push_back(page_keys(p));
    h.value_ptrs.push_back(page_values(p));
  }
  h.positions.reserve(slots);
  return true;
}

void KvCache::read_slot(SeqId seq, int layer, int kv_head, int32_t slot, uint16_t* k, uint16_t* v) const {
  const HeadTable& h = head(seq, layer, kv_head);
  if (slot < 0 || size_t(slot) >= h.positions.size()) {
    throw Error(ErrorCode::kInternal, "kv cache: read of slot " + std::to_string(slot) + " out of range");
  }
  const int32_t page = h.pages[size_t(slot) / config_.page_slots];
  const size_t in_page = size_t(slot) % config_.page_slots;
  const uint16_t* keys = page_keys(page);  // [head_dim][page_slots]
  for (int d = 0; d < config_.head_dim; ++d) k[d] = keys[size_t(d) * config_.page_slots + in_page];
  std::memcpy(v, page_values(page) + in_page * config_.head_dim, config_.head_dim * sizeof(uint16_t));
}

int32_t KvCache::append_pending(SeqId seq, int layer, int kv_head, int32_t pos) {
  HeadTable& h = head(seq, layer, kv_head);
  const size_t slot = h.positions.size();
  if (slot >= h.pages.size() * config_.page_slots) {
    throw Error(ErrorCode::kInternal, "kv cache: append without reserve");
  }
  // Before anything is written (a device mirror writes the row itself).
  if (is_shared(h.pages[slot / config_.page_slots])) {
    throw Error(ErrorCode::kInternal, "kv cache: an append into a shared page (reserve first)");
  }
  h.positions.push_back(pos);
  for (int32_t seen = h.max_position->load(std::memory_order_relaxed);
       pos > seen && !h.max_position->compare_exchange_weak(seen, pos, std::memory_order_relaxed);) {
  }
  return int32_t(slot);
}

int32_t KvCache::store_slot(const HeadTable& h, int32_t slot, const uint16_t* k, const uint16_t* v) {
  const int32_t page = h.pages[size_t(slot) / config_.page_slots];
  const size_t in_page = size_t(slot) % config_.page_slots;
  uint16_t* keys = page_keys(page);  // [head_dim][page_slots]
  for (int d = 0; d < config_.head_dim; ++d) keys[size_t(d) * config_.page_slots + in_page] = k[d];
  std::memcpy(page_values(page) + in_page * config_.head_dim, v, config_.head_dim * sizeof(uint16_t));
  return page;
}

void KvCache::append(SeqId seq, int layer, int kv_head, int32_t pos, const uint16_t* k, const uint16_t* v) {
  const int32_t slot = append_pending(seq, layer, kv_head, pos);
  mark_written(store_slot(head(seq, layer, kv_head), slot, k, v));
}

void KvCache::write_slot(SeqId seq, int layer, int kv_head, int32_t slot, const uint16_t* k, const uint16_t* v) {
  const HeadTable& h = head(seq, layer, kv_head);
  if (slot < 0 || size_t(slot) >= h.positions.size()) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: write_slot past the head's slots");
  }
  if (is_shared(h.pages[size_t(slot) / config_.page_slots])) {
    throw Error(ErrorCode::kInternal, "kv cache: a write into a shared page");
  }
  store_slot(h, slot, k, v);
}

int32_t KvCache::max_slots(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: unknown sequence " + std::to_string(seq));
  }
  size_t most = 0;
  for (const HeadTable& h : it->second.heads) most = std::max(most, h.positions.size());
  return int32_t(most);
}

int32_t KvCache::max_position(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    throw Error(ErrorCode::kInvalidArgument, "kv cache: unknown sequence " + std::to_string(seq));
  }
  return it->second.max_position.load(std::memory_order_relaxed);
}

int32_t KvCache::n_slots(SeqId seq, int layer, int kv_head) const {
  return int32_t(head(seq, layer, kv_head).positions.size());
}

std::span<const int32_t> KvCache::positions(SeqId seq, int layer, int kv_head) const {
  return head(seq, layer, kv_head).positions;
}

cpu::KvPages KvCache::view(SeqId seq, int layer, int kv_head) const {
  const HeadTable& h = head(seq, layer, kv_head);
  return cpu::KvPages{h.key_ptrs.data(), h.value_ptrs.data(), h.positions.data(),
                      int32_t(h.positions.size()), config_.page_slots};
}

void KvCache::compact(SeqId seq, int layer, int kv_head, std::span<const int32_t> keep) {
  HeadTable& h = head(seq, layer, kv_head);
  const int32_t n = int32_t(h.positions.size());
  const size_t row = size_t(config_.head_dim);
  // First the checks and the copies of shared pages that rows will move
  // into, so that a failure (bad indices, no memory) leaves the head as it was.
  int32_t prev = -1;
  size_t first_move = keep.size();
  for (size_t dst = 0; dst < keep.size(); ++dst) {
    if (keep[dst] <= prev || keep[dst] >= n) {
      throw Error(ErrorCode::kInternal, "kv cache: compact indices must be increasing and in range");
    }
    prev = keep[dst];
    if (first_move == keep.size() && size_t(keep[dst]) != dst) first_move = dst;
  }
  if (first_move < keep.size()) {
    for (size_t page = first_move / config_.page_slots; page <= (keep.size() - 1) / config_.page_slots; ++page) {
      make_private(h, page);  // no-op unless shared
    }
  }
  for (size_t dst = first_move; dst < keep.size(); ++dst) {
    const int32_t src = keep[dst];
    if (size_t(src) == dst) continue;
    const int32_t sp = h.pages[size_t(src) / config_.page_slots];
    const int32_t dp = h.pages[dst / config_.page_slots];
    const size_t si = size_t(src % config_.page_slots);
    const size_t di = dst % config_.page_slots;
    const uint16_t* sk = page_keys(sp);
    uint16_t* dk = page_keys(dp);
    for (size_t d = 0; d < row; ++d) dk[d * config_.page_slots + di] = sk[d * config_.page_slots + si];
    std::memcpy(page_values(dp) + di * row, page_values(sp) + si * row, row * sizeof(uint16_t));
    mark_written(dp);
    h.positions[dst] = h.positions[size_t(src)];
  }
  h.positions.resize(keep.size());
  const size_t pages_needed = (keep.size() + config_.page_slots - 1) / config_.page_slots;
  while (h.pages.size() > pages_needed) {
    give_page(h.pages.back());
    h.pages.pop_back();
    h.key_ptrs.pop_back();
    h.value_ptrs.pop_back();
  }
}

}  // namespace lazykv
