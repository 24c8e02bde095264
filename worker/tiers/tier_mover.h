// The worker's side of the tiers: background threads that move demoted
// blocks to a BlockStore (the node's kvstore over UCX, or an in-process
// TierStore) and fetch them back, off the decode step. Shared by every
// sequence of the process. Work runs in kLanes lanes, one thread each, so
// calls overlap their round trips; a (sequence, layer, KV head) always maps
// to the same lane, so its put, fetch and drop of one block run in order,
// and drop_sequence runs after everything queued before it in every lane.
//
// Failure: an Error(kUnavailable) from the store (the kvstore died) turns
// the tiers off for the rest of the process: it is logged once, pending
// fetches fail, further puts are refused, and policies go on as if they had
// no tiers (lazy+tiers then evicts exactly like lazy); the store is closed,
// so a kvstore that was only slow drops what this worker put. Other failures (no
// room, a block not found, any other exception) fail that one block only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/block_store.h"

namespace lazykv::tiers {

// A block on its way back. Filled by the mover thread.
class Fetch {
 public:
  enum class State { kPending, kDone, kFailed };
  State state() const { return state_.load(std::memory_order_acquire); }
  bool ready() const { return state() != State::kPending; }
  // Blocks until the fetch is done or failed.
  void wait();
  // The same, giving up at `deadline`; false if it is still pending then.
  bool wait_until(std::chrono::steady_clock::time_point deadline);
  // Valid once state() is kDone.
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  const std::string& error() const { return error_; }

 private:
  friend class TierMover;
  void finish(State state, std::string error = {});
  std::atomic<State> state_{State::kPending};
  std::vector<uint8_t> bytes_;
  std::string error_;
  std::mutex mutex_;
  std::condition_variable done_;
};

struct MoverStats {
  uint64_t blocks_demoted = 0, bytes_demoted = 0;
  uint64_t blocks_fetched = 0, bytes_fetched = 0;
  uint64_t refused = 0;   // puts not queued: tiers off or queue full
  uint64_t failures = 0;  // operations the store failed
  bool available = true;
  std::string last_error;
};

class TierMover {
 public:
  // `max_queued_bytes` bounds the demotions waiting for the store (beyond it
  // a put is refused: the block is evicted for good, never a stall).
  // A null store: the tiers are off from the start (`why` says why).
  explicit TierMover(std::unique_ptr<kvstore::BlockStore> store, uint64_t max_queued_bytes = 256ull << 20,
                     const std::string& why = "");
  ~TierMover();  // finishes queued work, then stops
  TierMover(const TierMover&) = delete;
  TierMover& operator=(const TierMover&) = delete;

  bool available() const { return available_.load(std::memory_order_acquire); }
  // Queues a demotion; false (nothing queued) when the tiers are off or the queue is full.
  bool put(const kvstore::BlockKey& key, std::vector<uint8_t> bytes, kvstore::BlockHint hint);
  // Queues a fetch of a block of `bytes` bytes; null when the tiers are off.
  std::shared_ptr<Fetch> fetch(const kvstore::BlockKey& key, size_t bytes, kvstore::BlockHint hint);
  // Queues a fetch of some rows of a block (only those travel); null when the tiers are off.
  std::shared_ptr<Fetch> fetch_rows(const kvstore::BlockKey& key, kvstore::RowSelection selection,
                                    kvstore::BlockHint hint);
  void drop(const kvstore::BlockKey& key);
  void drop_sequence(uint64_t model_fingerprint, uint64_t sequence);
  // Waits until everything queued so far is done.
  void flush();

  MoverStats stats() const;
  // The store's own counters (a call to the kvstore when remote); zeros when
  // the tiers are off or the call fails.
  kvstore::TierStoreStats store_stats();
  std::string describe() const { return description_; }

  // The lane whose thread runs a block's operations, in order; a hash of
  // the whole key, so one head's layers spread over every lane.
  static constexpr size_t kLanes = 4;
  static size_t lane_of(const kvstore::BlockKey& key);

 private:
  struct Op {
    std::function<void()> run;
    uint64_t queued_bytes = 0;
  };
  struct Lane {
    std::deque<Op> queue;
    std::condition_variable work;
    bool busy = false;
    std::thread thread;
  };
  using Read = std::function<size_t(kvstore::BlockStore&, std::span<uint8_t> out)>;
  std::shared_ptr<Fetch> start_fetch(const kvstore::BlockKey& key, size_t bytes, Read read);
  void enqueue(size_t lane, Op op);
  void loop(Lane& lane);
  bool idle_locked() const;
  void failed(const std::exception& e, bool fatal);

  // The store while the tiers are on (null after): closed once the tiers turn
  // off and the last operation using it ends, so a kvstore that is still
  // alive sees this worker go and frees its blocks.
  std::shared_ptr<kvstore::BlockStore> live_store() const;
  std::shared_ptr<kvstore::BlockStore> store_;  // guarded by mutex_
  const std::string description_;
  const uint64_t max_queued_bytes_;
  std::atomic<bool> available_{true};
  mutable std::mutex mutex_;  // guards every lane's queue and busy flag, the counters and stats_
  std::condition_variable idle_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  uint64_t queued_bytes_ = 0;
  bool stopping_ = false;
  MoverStats stats_;
};

// --- the process's tiers ---------------------------------------------------------
// Configured once by the CLI (--kvstore, --host-tier-mib, ...); the lazy+tiers
// policy finds them here, so every command (serve, worker, eval, generate)
// runs it through the same flags.
struct TierConfig {
  std::string kvstore_address;      // HOST:PORT of a `lazykv kvstore`; empty: in-process tiers
  std::string transports;           // UCX transports for the kvstore connection
  uint64_t host_tier_bytes = 256ull << 20;  // in-process tier 1
  // In-process tier-1 allocation unit: a lazy+tiers block is one eviction
  // step of one KV head (a few KiB on small models), so small units waste less.
  uint64_t host_alloc_unit = 4096;
  double step_seconds = 0.02;       // in-process tiers' clock unit (kvstore/tier_store.h "Time")
  std::string nvme_path;            // in-process tier 2 (empty: none)
  uint64_t nvme_tier_bytes = 4ull << 30;
};
// Replaces the configuration; the next process_tiers() builds from it.
void configure_tiers(const TierConfig& config);
// The process's mover, built on first use. Never null: if the kvstore cannot
// be reached, a mover with the tiers off (logged once).
std::shared_ptr<TierMover> process_tiers();
// Finishes the process mover's queued work and destroys it, so it never
// outlives main (static destruction order). Call before returning from main.
void shutdown_tiers();
// Unique per process and call: the `sequence` of a sequence's block keys.
uint64_t next_tier_sequence();
// Distinguishes this process's blocks from another's in a shared kvstore.
uint64_t process_fingerprint();

}  // namespace lazykv::tiers
