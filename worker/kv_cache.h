// Paged KV cache. Every (sequence, layer, KV head) has its own slot table: an
// ordered list of pages and the token position held by each slot. Heads can
// therefore keep different tokens and be compacted in place independently,
// which is what per-head eviction needs. K and V are stored as f16 (keys
// transposed within a page, see cpu::KvPages); memory is accounted in bytes
// against a fixed capacity.
//
// Pages are reference counted, so sequences can share the pages of a prompt
// prefix computed once: each slot table holds one reference to each of its
// pages, and a holder outside (a prefix cache) takes its own. A page goes
// back to the pool with its last reference and counts once against the
// capacity. Nothing ever writes into a shared page: compact() and reserve()
// first give the writing head a private copy (copy on write), so one
// sequence's eviction or appends never change another's KV.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/ops.h"

namespace lazykv {

using SeqId = int64_t;

struct KvCacheConfig {
  int n_layer = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int page_slots = 64;            // token slots per page (per KV head)
  size_t capacity_bytes = 0;      // 0: unbounded
};

class KvCache {
 public:
  explicit KvCache(const KvCacheConfig& config);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const { return config_; }

  // Sequences. add_sequence throws Error(kInvalidArgument) if id exists.
  // heads_per_layer: 0 for n_head_kv; a multiple of it to cache every KV head
  // once per query head of its group (GQA expanded, as eviction references
  // that select per query head do).
  void add_sequence(SeqId seq, int heads_per_layer = 0);
  void remove_sequence(SeqId seq);  // returns its pages to the pool
  bool has_sequence(SeqId seq) const;
  int heads_per_layer(SeqId seq) const;
  size_t n_sequences() const { return seqs_.size(); }

  // Makes room for `n_new` more slots in every (layer, KV head) of seq, so
  // that append() never allocates (appends run in parallel across heads).
  // Throws Error(kOutOfMemory) when the capacity would be exceeded; the cache
  // is unchanged then.
  void reserve(SeqId seq, int n_new);

  // reserve() for one (layer, KV head): room for n_new more slots there.
  // Returns false, changing nothing, when the capacity would be exceeded.
  // Safe to call concurrently for different heads (promotion runs layers in
  // parallel).
  bool reserve_head(SeqId seq, int layer, int kv_head, int n_new);

  // Appends one slot (f16 K and V rows of head_dim) at token position pos.
  // Requires a prior reserve(). Safe to call concurrently for different heads.
  void append(SeqId seq, int layer, int kv_head, int32_t pos, const uint16_t* k, const uint16_t* v);

  // For a device mirror that writes new rows itself: append() without the
  // rows (the slot's data is undefined until write_slot) and without
  // recording the page as written. Returns the slot.
  int32_t append_pending(SeqId seq, int layer, int kv_head, int32_t pos);
  // The rows of an existing slot, not recorded as written (the mirror has them).
  void write_slot(SeqId seq, int layer, int kv_head, int32_t slot, const uint16_t* k, const uint16_t* v);

  // The f16 K and V rows of one slot (head_dim each), as append() took them.
  void read_slot(SeqId seq, int layer, int kv_head, int32_t slot, uint16_t* k, uint16_t* v) const;

  int32_t n_slots(SeqId seq, int layer, int kv_head) const;
  // The highest token position ever appended to seq (-1: none), in any head.
  int32_t max_position(SeqId seq) const;
  // The most slots any (layer, KV head) of seq holds (heads compact independently).
  int32_t max_slots(SeqId seq) const;
  std::span<const int32_t> positions(SeqId seq, int layer, int kv_head) const;
  // Page view for the attention kernel; valid until the next reserve/compact/remove.
  cpu::KvPages view(SeqId seq, int layer, int kv_head) const;

  // Keeps only the slots whose indices are listed (strictly increasing),
  // moving them down in place (order preserved); frees emptied pages. Safe to
  // call concurrently for different heads (eviction runs layers in parallel).
  // A shared page it writes to is copied first; those copies may take the
  // cache past its capacity for as long as they live.
  void compact(SeqId seq, int layer, int kv_head, std::span<const int32_t> keep);

  // --- shared pages ---
  // Fills the empty (layer, cache head) of seq with `pages`, each full
  // (page_slots slots) and together holding positions 0, 1, ... in slot
  // order, taking a reference to each: the head then reads as if it had
  // appended those tokens. Error(kInvalidArgument) if the head is not empty.
  // With n_slots, only the first n_slots of them are the head's (the last
  // page partly: its first append gets a private copy of it).
  void adopt_pages(SeqId seq, int layer, int kv_head, std::span<const int32_t> pages, int32_t n_slots = -1);
  // References held outside the slot tables (a prefix cache's).
  void retain_pages(std::span<const int32_t> pages);
  void release_pages(std::span<const int32_t> pages);
  // References to `page` now (0: free).
  int32_t page_references(int32_t page) const;
  // A new page holding `bytes` (page_bytes() of them, in the page layout
  // below), with one reference for the caller (release_pages returns it).
  // Returns -1, taking nothing, when the capacity has no room for it.
  // Error(kInvalidArgument) for a size other than page_bytes().
  int32_t load_page(std::span<const uint8_t> bytes);

  // --- page access, for a mirror of the pool in device memory ---
  // A page is page_bytes() bytes: keys [head_dim][page_slots] f16, then values
  // [page_slots][head_dim] f16 at values_offset() (the cpu::KvPages layout).
  size_t values_offset() const { return size_t(config_.page_slots) * config_.head_dim * sizeof(uint16_t); }
  // Pages the pool holds (ids are 0 .. pool_pages() - 1; the pool only grows).
  size_t pool_pages() const { return pool_pages_; }
  const uint8_t* page_data(int32_t page) const { return reinterpret_cast<const uint8_t*>(page_keys(page)); }
  // The pages of one (layer, cache head), in slot order: slot s lives in
  // page_ids[s / page_slots] at s % page_slots.
  std::span<const int32_t> page_ids(SeqId seq, int layer, int kv_head) const;
  // From this call on, every page that append() or compact() writes is
  // recorded, so a mirror can copy just those (a page taken but not yet
  // written holds nothing a reader may see).
  void track_written_pages();
  // How many pages take_written_pages would return now.
  size_t written_page_count();
  // The pages written since the last call (each once, any order); clears the record.
  // Not concurrent with writers.
  void take_written_pages(std::vector<int32_t>& pages);

  size_t page_bytes() const { return page_bytes_; }
  size_t bytes_used() const { return pages_in_use_ * page_bytes_; }
  // Bytes of K/V data in live slots (what a policy's budget is measured in).
  size_t slot_bytes() const { return size_t(config_.head_dim) * 2 * sizeof(uint16_t); }
  size_t bytes_reserved() const { return pool_pages_ * page_bytes_; }
  size_t capacity_bytes() const { return config_.capacity_bytes; }

 private:
  // Whether `pages` more pages stay within capacity_bytes (pool_mutex_ held,
  // or the step thread alone).
  bool within_capacity(size_t pages) const {
    return config_.capacity_bytes == 0 || (pages_in_use_ + pages) * page_bytes_ <= config_.capacity_bytes;
  }
  struct HeadTable {
    std::vector<int32_t> pages;   // page ids, in slot order
    std::vector<const uint16_t*> key_ptrs;
    std::vector<const uint16_t*> value_ptrs;
    std::vector<int32_t> positions;  // size = n slots
    std::atomic<int32_t>* max_position = nullptr;  // its sequence's (append raises it)
  };
  struct Sequence {
    int heads_per_layer = 0;
    std::vector<HeadTable> heads;  // [n_layer * heads_per_layer]
    std::atomic<int32_t> max_position{-1};  // raised by append (heads append concurrently)
  };

  HeadTable& head(SeqId seq, int layer, int kv_head);
  const HeadTable& head(SeqId seq, int layer, int kv_head) const;
  int32_t take_page();
  int32_t take_page_locked();  // pool_mutex_ held
  void give_page(int32_t page);  // drops one reference
  std::atomic<int32_t>& references(int32_t page) const;
  bool is_shared(int32_t page) const;
  // Replaces page `index` of h by a private copy when it is shared.
  void make_private(HeadTable& h, size_t index);
  // Fills `copy` from page `index` of h and puts it there, unless the other
  // holders let go meanwhile (then `copy` goes back to the pool).
  void replace_with_copy(HeadTable& h, size_t index, int32_t copy);
  // Drops one reference unless it is the last; false (nothing changed) then.
  bool drop_shared_reference(int32_t page);
  // The page that an append to h would write and that is shared, or -1.
  int32_t shared_tail(const HeadTable& h) const;
  void mark_written(int32_t page);
  int32_t store_slot(const HeadTable& h, int32_t slot, const uint16_t* k, const uint16_t* v);  // returns the page
  uint16_t* page_keys(int32_t page) const;
  uint16_t* page_values(int32_t page) const;

  KvCacheConfig config_;
  size_t page_bytes_;
  static constexpr int kPagesPerChunk = 256;
  static constexpr size_t kMaxChunks = 1 << 16;  // chunks_ is reserved to this once
  std::vector<std::unique_ptr<uint8_t[]>> chunks_;  // pool memory, grown on demand
  std::vector<std::unique_ptr<std::atomic<int32_t>[]>> references_;  // per page, chunked like chunks_
  std::mutex pool_mutex_;  // guards free_pages_, pool growth and pages_in_use_
  std::vector<int32_t> free_pages_;
  size_t pool_pages_ = 0;
  size_t pages_in_use_ = 0;
  std::unordered_map<SeqId, Sequence> seqs_;
  // Written-page record (track_written_pages): a flag per page, one chunk of
  // flags per chunk of pages (stable addresses, like chunks_), and the list of
  // pages whose flag went up, under written_mutex_.
  bool track_written_ = false;
  std::vector<std::unique_ptr<std::atomic<uint8_t>[]>> written_flags_;
  std::mutex written_mutex_;
  std::vector<int32_t> written_;
};

}  // namespace lazykv
