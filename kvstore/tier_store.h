// The kvstore's tiers behind one interface: tier 1 (HostPool) replaced by a
// learning-augmented policy (Guard by default), tier 2 (NvmeTier) behind an
// admission rule, and the leases that keep in-flight blocks alive.
//
// Time: a hint's `steps_until_use` (decode steps until the worker predicts
// the block is read again) is added to the store's clock to order predicted
// next uses and to apply the tier-2 admission horizon. With step_seconds set
// (the kvstore and in-process tiers: one decode step's duration) the clock
// counts decode steps of wall time, the hints' own unit; with 0 it advances
// by one per put or get (tests, and the paging model's request time).
//
// Leases: a put reserves pool space for the transfer (PutReservation) and a
// get pins the block's bytes (ReadLease). Both belong to a peer. A block that
// is dropped while leased disappears from the index at once (no new get
// finds it) and its memory is freed when the last lease ends. A peer that
// dies has all its leases released (release_peer). RAII: destroying an
// uncommitted reservation aborts it; destroying a read lease releases it;
// both are no-ops after release_peer already ended them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/metrics/registry.h"
#include "kvstore/block.h"
#include "kvstore/paging/replacement_policy.h"

namespace lazykv::kvstore {

using PeerId = uint64_t;

struct TierStoreOptions {
  uint64_t host_capacity_bytes = 1ull << 30;
  uint64_t host_alloc_unit = 64 * 1024;
  std::string replacement = "guard";      // paging::make_replacement_policy name
  uint64_t seed = 1;                       // Guard's random choices
  std::string nvme_path;                   // empty: no tier 2 (victims are dropped)
  uint64_t nvme_capacity_bytes = 16ull << 30;
  // Admission to tier 2: a victim of tier 1 is written to tier 2 only if its
  // predicted next use is at most this many steps away. (A block predicted
  // never to be used again, or only after the horizon, would cost an NVMe
  // write that is unlikely to be read back.)
  uint64_t nvme_admit_horizon_steps = 4096;
  double step_seconds = 0;                 // the clock's unit (see "Time" above); 0: one per request
  metrics::Registry* metrics = nullptr;    // kvstore metrics, when set
};

struct BlockHint {
  uint64_t steps_until_use = paging::kNever;  // predicted steps until the block is read again
  // Put: a block any worker may read (a prompt block keyed by its content),
  // so the kvstore keeps it when the worker that put it goes.
  bool shared = false;
};

struct TierStoreStats {
  uint64_t host_capacity_bytes = 0, host_used_bytes = 0;
  double host_fragmentation = 0;
  size_t host_blocks = 0;
  uint64_t nvme_capacity_bytes = 0, nvme_used_bytes = 0;
  size_t nvme_blocks = 0;
  size_t leases = 0;                  // reservations + read leases outstanding
  size_t zombie_blocks = 0;           // dropped but still leased
  uint64_t puts = 0, gets = 0, host_hits = 0, nvme_hits = 0, misses = 0;
  uint64_t nvme_admitted = 0, nvme_rejected = 0, dropped_victims = 0;
  uint64_t nvme_evicted = 0;  // tier-2 blocks erased to make room for an admitted victim
};

class TierStore;

// Pool space for one incoming block. Move-only.
class PutReservation {
 public:
  PutReservation() = default;
  PutReservation(PutReservation&& other) noexcept;
  PutReservation& operator=(PutReservation&& other) noexcept;
  ~PutReservation();  // aborts if neither committed nor released
  std::span<uint8_t> buffer() const { return buffer_; }  // where the payload goes
  bool valid() const { return store_ != nullptr; }

 private:
  friend class TierStore;
  TierStore* store_ = nullptr;
  uint64_t lease_ = 0;
  std::span<uint8_t> buffer_;
};

// The bytes of one block, unmodified and alive until released. Move-only.
class ReadLease {
 public:
  ReadLease() = default;
  ReadLease(ReadLease&& other) noexcept;
  ReadLease& operator=(ReadLease&& other) noexcept;
  ~ReadLease();
  std::span<const uint8_t> bytes() const { return bytes_; }
  uint64_t checksum() const { return checksum_; }
  bool valid() const { return store_ != nullptr; }
  void release();

 private:
  friend class TierStore;
  TierStore* store_ = nullptr;
  uint64_t lease_ = 0;
  std::span<const uint8_t> bytes_;
  uint64_t checksum_ = 0;
};

class TierStore {
 public:
  explicit TierStore(TierStoreOptions options);  // opens tier 2 if configured (recovering its blocks)
  ~TierStore();  // Error-free; outstanding leases must have ended (checked in debug builds)
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  // The pool's arena, for the transport to register once.
  std::span<uint8_t> host_arena();

  // Put, phase 1: reserves `bytes` of tier 1 for `key`, making room by moving
  // the policy's victims to tier 2 (if admitted) or dropping them. Leased
  // blocks are never victims. Error(kInvalidArgument) if bytes is 0;
  // Error(kOutOfMemory) if no room can be made.
  PutReservation reserve_put(PeerId peer, const BlockKey& key, uint64_t bytes, BlockHint hint);
  // Put, phase 2: verifies `checksum` against the received bytes and
  // publishes the block (replacing a block with the same key). Returns false
  // if the block's sequence was dropped while it was in flight (the space is
  // freed). Error(kInvalidArgument) on a checksum mismatch (space freed).
  bool commit_put(PutReservation&& reservation, uint64_t checksum);

  // A read lease on a block, read back from tier 2 into tier 1 first if it is
  // only there (its checksum verified). Error(kNotFound) if absent; Error(kIo)
  // if the tier-2 copy is corrupt (it is erased); Error(kOutOfMemory) if tier
  // 1 has no room to stage it.
  ReadLease get(PeerId peer, const BlockKey& key, BlockHint next_use);
  // The selected rows of a block (gather_block_rows), copied under a read
  // lease that ends before this returns. The errors of get; a block whose
  // bytes no longer match its checksum is erased (Error(kIo)).
  std::vector<uint8_t> get_rows(PeerId peer, const BlockKey& key, BlockHint next_use, const RowSelection& selection);

  bool drop(const BlockKey& key);                           // false if absent
  size_t drop_sequence(uint64_t model_fingerprint, uint64_t sequence);  // blocks dropped
  // Every block of every sequence of the fingerprint (a worker process's,
  // once it is gone); blocks dropped. In batches, the lock released between
  // them, since a worker's blocks can be millions.
  size_t drop_model(uint64_t model_fingerprint);
  // The peer is gone: abort its reservations and release its read leases.
  // Returns how many leases ended.
  size_t release_peer(PeerId peer);

  TierStoreStats stats() const;

 private:
  // drop_sequence, or with no sequence one batch of drop_model (at most
  // `limit` index entries and tier-2 blocks). Returns the index entries
  // dropped and whether any may be left.
  std::pair<size_t, bool> drop_range(uint64_t model_fingerprint, std::optional<uint64_t> sequence, size_t limit);
  friend class PutReservation;
  friend class ReadLease;
  void abort_reservation(uint64_t lease);
  void release_read(uint64_t lease);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv::kvstore
