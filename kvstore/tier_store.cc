// TierStore: the index, the host pool (tier 1), the RocksDB tier (tier 2),
// the replacement policy and the leases, behind one mutex.
//
// State.
//   index        BlockKey -> Entry {tier (host | nvme), page id, checksum,
//                predicted next use (absolute clock time)}. Only published
//                blocks are in it; a dropped block leaves it at once.
//   host_blocks  page id -> HostBlock {key, pool offset + bytes, checksum,
//                leases, zombie, in_policy}: every published host block plus
//                the zombies (dropped while leased). Reservations are not
//                blocks yet: their pool space is held by the lease itself.
//   leases       lease id -> Lease {peer, kind, ...}. A reservation holds its
//                pool space, key, page id and hint; a read lease names the
//                host block it pins.
//   Page ids come from a counter and belong to one key's published block:
//   a block keeps its page id when it moves to tier 2 and back (so Guard
//   sees a re-request of a page it evicted); a new put of the key, or a
//   block recovered from tier 2 at open, takes a fresh id. No id is reused.
//
// Policy membership. The policy holds exactly the published host blocks that
// have no lease, so choose_victim can never return a leased block. A block
// leaves the policy (erase) when its first read lease starts and enters it
// (request + insert at the current clock with its latest hint) when the last
// one ends; commit_put enters a new block the same way. The policy sees a
// read at release time, which is when the block becomes evictable anyway.
//
// Making room (reserve_put, and get from tier 2). If the pool cannot allocate,
// and the free bytes plus the evictable (in-policy) bytes cannot cover the
// request, Error(kOutOfMemory) without evicting anything. Otherwise the
// incoming page is requested (a miss) and victims are chosen one at a time
// until the allocation succeeds. A victim goes to tier 2 if tier 2 is
// configured and its predicted next use is at most nvme_admit_horizon_steps
// after the current clock (never predicted: rejected); otherwise, or if tier
// 2 is full and cannot make room, it is dropped. Counting: nvme_admitted =
// written to tier 2; nvme_rejected = tier 2 configured but not written (the
// rule or a full tier); dropped_victims = every victim not written.
//
// Making room in tier 2. Tier 2 keeps blocks of peers that are gone (shared
// prompt blocks, blocks recovered at open), so it must evict or it fills for
// good. When a victim admitted by the rule does not fit, tier-2 blocks are
// erased one at a time: first those whose predicted use has passed without a
// read (the longest overdue first), then those predicted furthest away (never
// predicted, e.g. recovered, first), but only while they are predicted later
// than the incoming victim (an overdue victim displaces only overdue blocks);
// otherwise the victim is rejected. nvme_by_use
// orders tier-2 entries by predicted next use for this; nvme_evicted counts
// the blocks erased.
//
// Tiers are exclusive: a get that finds the block only in tier 2 reads it
// (NvmeTier verifies its key and checksum; we also compare the checksum the
// index recorded when it was demoted), allocates pool space for it (evicting
// as above; on kOutOfMemory the block stays in tier 2), copies it in and
// erases it from tier 2. Keeping a copy in both tiers would save a rewrite
// when the block is evicted again, but would count each such block twice and
// hold tier-2 capacity for blocks that are in DRAM.
//
// Drops. drop and drop_sequence remove index entries at once; a host block
// without leases is freed now, a leased one becomes a zombie, freed when its
// last lease ends; tier-2 copies are erased (drop_sequence: erase_sequence,
// which also catches anything the index missed). drop_sequence marks the
// sequence's outstanding reservations cancelled: their commit frees the
// space and returns false. A reservation made after the drop is unaffected.
// drop(key) does not cancel an in-flight put of that key (the put publishes
// a new version later; it remains reachable by drop and drop_sequence).
//
// Leases and peers. release_peer ends every lease of the peer (reservations
// aborted, read leases released); the RAII objects of those leases then find
// no lease under their id and do nothing. A commit_put of a reservation that
// release_peer already ended returns false.
//
// Threads. One mutex guards everything, including the RocksDB calls made
// while evicting or promoting: an operation is atomic with respect to every
// other one, which keeps the index, the pool, tier 2 and the policy in step.
// RocksDB puts are WAL appends plus a memtable insert (no fsync by default),
// so the critical section stays short for 64 KiB to MiB blocks.
#include "kvstore/tier_store.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kvstore/host_pool.h"
#include "kvstore/nvme_tier.h"

namespace lazykv::kvstore {

namespace {

using paging::kNever;
using paging::PageId;
using Clock = std::chrono::steady_clock;

enum class Tier { kHost, kNvme };

// The absolute clock time of a use `steps` after `now`, saturating below
// kNever so that a far but finite prediction stays finite.
uint64_t absolute_next_use(uint64_t now, uint64_t steps) {
  if (steps == kNever) return kNever;
  if (steps >= kNever - 1 - now) return kNever - 1;
  return now + steps;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct TierStore::Impl {
  struct Entry {
    Tier tier = Tier::kHost;
    PageId page = 0;
    uint64_t checksum = 0;
    bool checksum_known = false;  // false for blocks recovered from tier 2 at open
    uint64_t next_use = kNever;   // absolute; from the latest put or get hint
  };
  struct HostBlock {
    BlockKey key;
    uint64_t offset = 0, bytes = 0, checksum = 0;
    size_t leases = 0;
    bool zombie = false;
    bool in_policy = false;
  };
  struct Lease {
    PeerId peer = 0;
    bool reservation = false;
    PageId page = 0;  // read: the leased host block; reservation: the page it publishes as
    // Reservations only.
    BlockKey key;
    uint64_t offset = 0, bytes = 0, next_use = kNever;
    bool cancelled = false;  // its sequence was dropped while in flight
  };
  struct Metrics {
    metrics::Gauge *host_bytes, *nvme_bytes, *host_capacity, *nvme_capacity, *host_blocks, *nvme_blocks, *leases,
        *fragmentation;
    metrics::Counter *admitted, *rejected, *evicted, *to_nvme_bytes, *to_host_bytes;
    metrics::Histogram *to_nvme_seconds, *to_host_seconds;
  };

  explicit Impl(TierStoreOptions opts)
      : options(std::move(opts)),
        pool(options.host_capacity_bytes, options.host_alloc_unit),
        policy(paging::make_replacement_policy(options.replacement, options.seed)) {
    if (!options.nvme_path.empty()) {
      nvme = std::make_unique<NvmeTier>(NvmeTierOptions{options.nvme_path, options.nvme_capacity_bytes, false});
      // Blocks already in tier 2 are published; their next use is unknown
      // and their checksum is learned (and verified by NvmeTier) on read.
      for (const BlockKey& key : nvme->keys()) {
        index.emplace(key, Entry{Tier::kNvme, next_page++, 0, false, kNever});
        nvme_by_use.emplace(kNever, key);
      }
    }
    if (options.metrics) {
      metrics::Registry& r = *options.metrics;
      using namespace lazykv::metrics;
      m = Metrics{&r.gauge(kKvBytes, {"host"}),
                  &r.gauge(kKvBytes, {"nvme"}),
                  &r.gauge(kKvCapacityBytes, {"host"}),
                  &r.gauge(kKvCapacityBytes, {"nvme"}),
                  &r.gauge(kKvstoreBlocks, {"host"}),
                  &r.gauge(kKvstoreBlocks, {"nvme"}),
                  &r.gauge(kKvstoreLeases),
                  &r.gauge(kKvstorePoolFragmentation),
                  &r.counter(kKvstoreNvmeAdmissions, {"admitted"}),
                  &r.counter(kKvstoreNvmeAdmissions, {"rejected"}),
                  &r.counter(kKvstoreNvmeAdmissions, {"evicted"}),
                  &r.counter(kTransferBytes, {"host", "nvme"}),
                  &r.counter(kTransferBytes, {"nvme", "host"}),
                  &r.histogram(kTransferDuration, {"host", "nvme"}),
                  &r.histogram(kTransferDuration, {"nvme", "host"})};
      update_gauges();
    }
  }

  uint64_t rounded(uint64_t bytes) const {
    return (bytes + options.host_alloc_unit - 1) / options.host_alloc_unit * options.host_alloc_unit;
  }
  // What the policy is told: a predicted use must lie after now.
  uint64_t policy_prediction(uint64_t next_use) const {
    return next_use == kNever ? kNever : std::max(next_use, clock + 1);
  }

  // --- pool ----------------------------------------------------------------

  std::optional<uint64_t> allocate(uint64_t bytes) {
    auto offset = pool.allocate(bytes);
    if (offset) allocated_bytes += rounded(bytes);
    return offset;
  }
  void free_space(uint64_t offset, uint64_t bytes) {
    pool.free(offset);
    allocated_bytes -= rounded(bytes);
  }
  void free_host_block(PageId page) {
    auto it = host_blocks.find(page);
    free_space(it->second.offset, it->second.bytes);
    host_blocks.erase(it);
  }

  // --- policy membership -----------------------------------------------------

  void enter_policy(PageId page, HostBlock& block, uint64_t next_use) {
    policy->request(page, clock, policy_prediction(next_use));
    policy->insert(page);
    block.in_policy = true;
    evictable_bytes += rounded(block.bytes);
  }
  void leave_policy(PageId page, HostBlock& block) {
    if (!block.in_policy) return;
    policy->erase(page);
    block.in_policy = false;
    evictable_bytes -= rounded(block.bytes);
  }

  // --- eviction ---------------------------------------------------------------

  // Moves the policy's victim to tier 2 or drops it.
  void evict(PageId victim) {
    auto block_it = host_blocks.find(victim);
    if (block_it == host_blocks.end() || block_it->second.leases != 0 || block_it->second.zombie) {
      throw Error(ErrorCode::kInternal, "tier store: the policy chose page " + std::to_string(victim) +
                                            ", which is not an unleased host block");
    }
    HostBlock& block = block_it->second;
    block.in_policy = false;  // choose_victim removed it
    evictable_bytes -= rounded(block.bytes);
    auto entry_it = index.find(block.key);
    Entry& entry = entry_it->second;

    if (nvme) {
      const uint64_t steps = entry.next_use == kNever ? kNever : (entry.next_use > clock ? entry.next_use - clock : 0);
      if (steps != kNever && steps <= options.nvme_admit_horizon_steps && make_nvme_room(block.bytes, entry.next_use)) {
        const auto start = Clock::now();
        bool written = false;
        try {
          nvme->put(block.key, {pool.at(block.offset), block.bytes}, block.checksum);
          written = true;
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kOutOfMemory) {  // a RocksDB failure: the victim is lost, the caller learns why
            drop_victim(entry_it, victim);
            throw;
          }
        }
        if (written) {
          ++counters.nvme_admitted;
          if (options.metrics) {
            m.admitted->inc();
            m.to_nvme_bytes->inc(static_cast<double>(block.bytes));
            m.to_nvme_seconds->observe(seconds_since(start));
          }
          entry.tier = Tier::kNvme;
          entry.checksum = block.checksum;
          entry.checksum_known = true;
          nvme_by_use.emplace(entry.next_use, block.key);
          --host_published;
          free_host_block(victim);
          return;
        }
      }
      ++counters.nvme_rejected;  // by the rule, or tier 2 is full
      if (options.metrics) m.rejected->inc();
    }
    drop_victim(entry_it, victim);
  }

  // See "Making room in tier 2" above. False: the victim is rejected.
  bool make_nvme_room(uint64_t bytes, uint64_t next_use) {
    const NvmeTierStats tier = nvme->stats();
    if (bytes > tier.capacity_bytes) return false;
    uint64_t used = tier.used_bytes;
    while (used + bytes > tier.capacity_bytes && !nvme_by_use.empty()) {
      auto candidate = nvme_by_use.begin();
      if (candidate->first >= clock) {  // none overdue: the furthest, if later than the victim
        candidate = std::prev(nvme_by_use.end());
        // An overdue victim (its own use passed unread) displaces only overdue blocks.
        if (next_use < clock || candidate->first <= next_use) return false;
      }
      const BlockKey key = candidate->second;
      const uint64_t freed = nvme->block_bytes(key).value_or(0);
      try {
        nvme->erase(key);
      } catch (const Error&) {  // a RocksDB failure: the block stays, the victim is dropped instead
        return false;
      }
      nvme_by_use.erase(candidate);
      index.erase(key);
      used -= freed;
      ++counters.nvme_evicted;
      if (options.metrics) m.evicted->inc();
    }
    return used + bytes <= tier.capacity_bytes;
  }
  // Before a tier-2 entry leaves the index or tier 2.
  void forget_nvme_entry(const BlockKey& key, const Entry& entry) {
    if (entry.tier == Tier::kNvme) nvme_by_use.erase({entry.next_use, key});
  }

  void drop_victim(std::map<BlockKey, Entry>::iterator entry_it, PageId victim) {
    ++counters.dropped_victims;
    index.erase(entry_it);
    --host_published;
    free_host_block(victim);
  }

  // Pool space for `bytes` of the incoming page, evicting as needed.
  uint64_t make_room(uint64_t bytes, PageId incoming, uint64_t next_use) {
    if (auto offset = allocate(bytes)) return *offset;
    if (rounded(bytes) > options.host_capacity_bytes - allocated_bytes + evictable_bytes) {
      throw Error(ErrorCode::kOutOfMemory, "tier store: no room for " + std::to_string(bytes) +
                                               " bytes in the host pool (the rest is leased)");
    }
    policy->request(incoming, clock, policy_prediction(next_use));
    while (policy->size() > 0) {
      evict(policy->choose_victim(incoming));
      if (auto offset = allocate(bytes)) return *offset;
    }
    throw Error(ErrorCode::kOutOfMemory,
                "tier store: no room for " + std::to_string(bytes) + " bytes in the host pool (fragmented)");
  }

  // --- removal ---------------------------------------------------------------

  // A host block leaves the index: freed now, or a zombie until its last lease ends.
  void retire_host_block(PageId page) {
    HostBlock& block = host_blocks.at(page);
    leave_policy(page, block);
    --host_published;
    if (block.leases == 0) {
      free_host_block(page);
    } else {
      block.zombie = true;
      ++zombies;
    }
  }

  void remove_entry(std::map<BlockKey, Entry>::iterator it) {
    const BlockKey key = it->first;
    const Entry entry = it->second;
    forget_nvme_entry(key, entry);
    index.erase(it);
    if (entry.tier == Tier::kHost) {
      retire_host_block(entry.page);
    } else {
      nvme->erase(key);
    }
  }

  // --- leases ----------------------------------------------------------------

  uint64_t new_lease(Lease lease) {
    const uint64_t id = next_lease++;
    leases.emplace(id, std::move(lease));
    return id;
  }

  void start_read(PageId page, HostBlock& block) {
    ++block.leases;
    leave_policy(page, block);
  }

  // Ends one read lease (already removed from `leases`).
  void end_read(PageId page) {
    HostBlock& block = host_blocks.at(page);
    if (--block.leases != 0) return;
    if (block.zombie) {
      --zombies;
      free_host_block(page);
    } else {
      enter_policy(page, block, index.at(block.key).next_use);
    }
  }

  void end_lease(std::unordered_map<uint64_t, Lease>::iterator it) {
    const Lease lease = std::move(it->second);
    leases.erase(it);
    if (lease.reservation) {
      free_space(lease.offset, lease.bytes);
      policy->erase(lease.page);  // no effect unless it was requested while making room
    } else {
      end_read(lease.page);
    }
  }

  void update_gauges() {
    if (!options.metrics) return;
    const HostPoolStats p = pool.stats();
    m.host_bytes->set(static_cast<double>(p.used_bytes));
    m.host_capacity->set(static_cast<double>(p.capacity_bytes));
    m.host_blocks->set(static_cast<double>(host_published));
    m.fragmentation->set(p.fragmentation);
    m.leases->set(static_cast<double>(leases.size()));
    if (nvme) {
      const NvmeTierStats n = nvme->stats();
      m.nvme_bytes->set(static_cast<double>(n.used_bytes));
      m.nvme_capacity->set(static_cast<double>(n.capacity_bytes));
      m.nvme_blocks->set(static_cast<double>(n.blocks));
    }
  }

  // Advances the clock for one request: by one, or to the decode steps
  // elapsed since start when options.step_seconds is set (so that hints in
  // decode steps and the clock share a unit however many requests a step makes).
  void tick() {
    if (options.step_seconds <= 0) {
      ++clock;
      return;
    }
    const double steps = std::chrono::duration<double>(Clock::now() - started).count() / options.step_seconds;
    clock = std::max(clock, uint64_t(steps));
  }

  TierStoreOptions options;
  HostPool pool;
  std::unique_ptr<NvmeTier> nvme;
  std::unique_ptr<paging::ReplacementPolicy> policy;
  Metrics m{};
  mutable std::mutex mutex;

  uint64_t clock = 0;
  const Clock::time_point started = Clock::now();
  PageId next_page = 1;
  uint64_t next_lease = 1;
  std::map<BlockKey, Entry> index;  // ordered: one sequence's keys are contiguous
  std::unordered_map<PageId, HostBlock> host_blocks;
  std::unordered_map<uint64_t, Lease> leases;
  size_t host_published = 0;     // index entries in tier 1
  size_t zombies = 0;
  uint64_t allocated_bytes = 0;  // pool bytes in use, in allocation units
  uint64_t evictable_bytes = 0;  // pool bytes of the blocks in the policy
  std::set<std::pair<uint64_t, BlockKey>> nvme_by_use;  // every tier-2 entry: (next_use, key)
  TierStoreStats counters;       // the event counters only
};

// --- RAII handles -----------------------------------------------------------

PutReservation::PutReservation(PutReservation&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      lease_(std::exchange(other.lease_, 0)),
      buffer_(std::exchange(other.buffer_, {})) {}

PutReservation& PutReservation::operator=(PutReservation&& other) noexcept {
  if (this != &other) {
    if (store_) {
      try {
        store_->abort_reservation(lease_);
      } catch (...) {
      }
    }
    store_ = std::exchange(other.store_, nullptr);
    lease_ = std::exchange(other.lease_, 0);
    buffer_ = std::exchange(other.buffer_, {});
  }
  return *this;
}

PutReservation::~PutReservation() {
  if (!store_) return;
  try {
    store_->abort_reservation(lease_);
  } catch (...) {  // only a broken invariant throws; a destructor must not
  }
}

ReadLease::ReadLease(ReadLease&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      lease_(std::exchange(other.lease_, 0)),
      bytes_(std::exchange(other.bytes_, {})),
      checksum_(std::exchange(other.checksum_, 0)) {}

ReadLease& ReadLease::operator=(ReadLease&& other) noexcept {
  if (this != &other) {
    try {
      release();
    } catch (...) {
    }
    store_ = std::exchange(other.store_, nullptr);
    lease_ = std::exchange(other.lease_, 0);
    bytes_ = std::exchange(other.bytes_, {});
    checksum_ = std::exchange(other.checksum_, 0);
  }
  return *this;
}

ReadLease::~ReadLease() {
  try {
    release();
  } catch (...) {
  }
}

void ReadLease::release() {
  if (!store_) return;
  TierStore* store = std::exchange(store_, nullptr);
  bytes_ = {};
  store->release_read(lease_);
}

// --- TierStore ----------------------------------------------------------------

TierStore::TierStore(TierStoreOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

TierStore::~TierStore() {
  assert(impl_->leases.empty() && "TierStore destroyed with outstanding leases");
}

std::span<uint8_t> TierStore::host_arena() {
  std::lock_guard lock(impl_->mutex);
  return impl_->pool.arena();
}

PutReservation TierStore::reserve_put(PeerId peer, const BlockKey& key, uint64_t bytes, BlockHint hint) {
  if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, "tier store: put of an empty block " + key.to_string());
  Impl& s = *impl_;
  if (bytes > s.options.host_capacity_bytes) {
    throw Error(ErrorCode::kOutOfMemory, "tier store: block " + key.to_string() + " of " + std::to_string(bytes) +
                                             " bytes exceeds the host pool capacity");
  }
  std::lock_guard lock(s.mutex);
  s.tick();
  const PageId page = s.next_page++;
  const uint64_t next_use = absolute_next_use(s.clock, hint.steps_until_use);
  uint64_t offset = 0;
  try {
    offset = s.make_room(bytes, page, next_use);
  } catch (...) {
    s.update_gauges();  // victims may have moved before it failed
    throw;
  }
  Impl::Lease lease;
  lease.peer = peer;
  lease.reservation = true;
  lease.page = page;
  lease.key = key;
  lease.offset = offset;
  lease.bytes = bytes;
  lease.next_use = next_use;
  PutReservation reservation;
  reservation.store_ = this;
  reservation.lease_ = s.new_lease(std::move(lease));
  reservation.buffer_ = {s.pool.at(offset), bytes};
  s.update_gauges();
  return reservation;
}

bool TierStore::commit_put(PutReservation&& reservation, uint64_t checksum) {
  if (reservation.store_ != this) {
    throw Error(ErrorCode::kInvalidArgument, "tier store: commit of a reservation that is not open on this store");
  }
  const uint64_t id = std::exchange(reservation.lease_, 0);
  reservation.store_ = nullptr;  // from here on its destructor does nothing
  reservation.buffer_ = {};

  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  auto it = s.leases.find(id);
  if (it == s.leases.end()) return false;  // release_peer ended it
  const Impl::Lease lease = it->second;
  if (lease.cancelled) {
    s.end_lease(it);
    s.update_gauges();
    return false;
  }
  const uint64_t actual = block_checksum({s.pool.at(lease.offset), lease.bytes});
  if (actual != checksum) {
    s.end_lease(it);
    s.update_gauges();
    throw Error(ErrorCode::kInvalidArgument, "tier store: checksum mismatch for block " + lease.key.to_string());
  }
  s.leases.erase(it);  // the space now belongs to the block
  if (auto old = s.index.find(lease.key); old != s.index.end()) {
    try {
      s.remove_entry(old);  // only a tier-2 erase can throw (kIo); the old entry is gone either way
    } catch (...) {
      s.free_space(lease.offset, lease.bytes);
      s.update_gauges();
      throw;
    }
  }
  auto [block_it, inserted] = s.host_blocks.emplace(
      lease.page, Impl::HostBlock{lease.key, lease.offset, lease.bytes, actual, 0, false, false});
  assert(inserted);
  (void)inserted;
  s.index.emplace(lease.key, Impl::Entry{Tier::kHost, lease.page, actual, true, lease.next_use});
  ++s.host_published;
  ++s.counters.puts;
  s.enter_policy(lease.page, block_it->second, lease.next_use);
  s.update_gauges();
  return true;
}

ReadLease TierStore::get(PeerId peer, const BlockKey& key, BlockHint next_use_hint) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  s.tick();
  ++s.counters.gets;
  auto it = s.index.find(key);
  if (it == s.index.end()) {
    ++s.counters.misses;
    throw Error(ErrorCode::kNotFound, "tier store: no block " + key.to_string());
  }
  Impl::Entry& entry = it->second;
  const uint64_t next_use = absolute_next_use(s.clock, next_use_hint.steps_until_use);

  if (entry.tier == Tier::kNvme) {
    // Read first: if the pool then has no room, the block stays in tier 2.
    const auto start = Clock::now();
    std::vector<uint8_t> data;
    bool found = false;
    try {
      found = s.nvme->get(key, data);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kIo) {  // corrupt: NvmeTier erased it
        s.forget_nvme_entry(key, entry);
        s.index.erase(it);
        ++s.counters.misses;
        s.update_gauges();
      }
      throw;
    }
    if (!found || data.empty()) {
      s.forget_nvme_entry(key, entry);
      s.index.erase(it);
      ++s.counters.misses;
      s.update_gauges();
      throw Error(ErrorCode::kNotFound, "tier store: block " + key.to_string() + " is missing from tier 2");
    }
    const uint64_t checksum = block_checksum(data);
    if (entry.checksum_known && checksum != entry.checksum) {
      s.forget_nvme_entry(key, entry);
      s.index.erase(it);
      s.nvme->erase(key);
      ++s.counters.misses;
      s.update_gauges();
      throw Error(ErrorCode::kIo, "tier store: block " + key.to_string() + " read from tier 2 has the wrong checksum");
    }
    if (data.size() > s.options.host_capacity_bytes) {
      throw Error(ErrorCode::kOutOfMemory, "tier store: block " + key.to_string() + " exceeds the host pool capacity");
    }
    // The block leaves tier 2's eviction order first: making room in the pool
    // may make room in tier 2, which must not erase the block being promoted.
    s.forget_nvme_entry(key, entry);
    uint64_t offset = 0;
    try {
      offset = s.make_room(data.size(), entry.page, next_use);
    } catch (...) {
      s.nvme_by_use.emplace(entry.next_use, key);  // it stays in tier 2
      s.update_gauges();
      throw;
    }
    std::memcpy(s.pool.at(offset), data.data(), data.size());
    try {
      s.nvme->erase(key);
    } catch (...) {
      s.free_space(offset, data.size());
      s.nvme_by_use.emplace(entry.next_use, key);
      s.update_gauges();
      throw;
    }
    if (s.options.metrics) {
      s.m.to_host_bytes->inc(static_cast<double>(data.size()));
      s.m.to_host_seconds->observe(seconds_since(start));
    }
    s.host_blocks.emplace(entry.page, Impl::HostBlock{key, offset, data.size(), checksum, 0, false, false});
    entry.tier = Tier::kHost;
    entry.checksum = checksum;
    entry.checksum_known = true;
    ++s.host_published;
    ++s.counters.nvme_hits;
  } else {
    ++s.counters.host_hits;
  }

  entry.next_use = next_use;
  Impl::HostBlock& block = s.host_blocks.at(entry.page);
  s.start_read(entry.page, block);
  Impl::Lease lease;
  lease.peer = peer;
  lease.page = entry.page;
  ReadLease result;
  result.store_ = this;
  result.lease_ = s.new_lease(std::move(lease));
  result.bytes_ = {s.pool.at(block.offset), block.bytes};
  result.checksum_ = block.checksum;
  s.update_gauges();
  return result;
}

std::vector<uint8_t> TierStore::get_rows(PeerId peer, const BlockKey& key, BlockHint next_use,
                                        const RowSelection& selection) {
  ReadLease lease = get(peer, key, next_use);
  try {
    return gather_block_rows(key, lease.bytes(), lease.checksum(), selection);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kIo) throw;
    lease.release();
    drop(key);  // corrupt in tier 1: never served again
    throw;
  }
}

bool TierStore::drop(const BlockKey& key) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  auto it = s.index.find(key);
  if (it == s.index.end()) return false;
  s.remove_entry(it);
  s.update_gauges();
  return true;
}

size_t TierStore::drop_sequence(uint64_t model_fingerprint, uint64_t sequence) {
  return drop_range(model_fingerprint, sequence, SIZE_MAX).first;
}

size_t TierStore::drop_model(uint64_t model_fingerprint) {
  constexpr size_t kBatch = 4096;
  size_t dropped = 0;
  for (bool more = true; more;) {
    const auto [n, left] = drop_range(model_fingerprint, std::nullopt, kBatch);
    dropped += n;
    more = left;
  }
  return dropped;
}

std::pair<size_t, bool> TierStore::drop_range(uint64_t model_fingerprint, std::optional<uint64_t> sequence,
                                              size_t limit) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  const auto in_range = [&](const BlockKey& key) {
    return key.model_fingerprint == model_fingerprint && (!sequence || key.sequence == *sequence);
  };
  for (auto& [id, lease] : s.leases) {
    if (lease.reservation && in_range(lease.key)) lease.cancelled = true;
  }
  size_t dropped = 0;
  auto it = s.index.lower_bound(BlockKey{model_fingerprint, sequence.value_or(0), 0, 0, 0, 0});
  while (dropped < limit && it != s.index.end() && in_range(it->first)) {
    if (it->second.tier == Tier::kHost) s.retire_host_block(it->second.page);
    s.forget_nvme_entry(it->first, it->second);
    it = s.index.erase(it);
    ++dropped;
  }
  bool left = it != s.index.end() && in_range(it->first);
  if (s.nvme && sequence) s.nvme->erase_sequence(model_fingerprint, *sequence);
  if (s.nvme && !sequence) left = s.nvme->erase_model(model_fingerprint, limit) == limit || left;
  s.update_gauges();
  return {dropped, left};
}

size_t TierStore::release_peer(PeerId peer) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  size_t ended = 0;
  for (auto it = s.leases.begin(); it != s.leases.end();) {
    auto next = std::next(it);
    if (it->second.peer == peer) {
      s.end_lease(it);
      ++ended;
    }
    it = next;
  }
  s.update_gauges();
  return ended;
}

TierStoreStats TierStore::stats() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  TierStoreStats out = s.counters;
  const HostPoolStats pool = s.pool.stats();
  out.host_capacity_bytes = pool.capacity_bytes;
  out.host_used_bytes = pool.used_bytes;
  out.host_fragmentation = pool.fragmentation;
  out.host_blocks = s.host_published;
  if (s.nvme) {
    const NvmeTierStats nvme = s.nvme->stats();
    out.nvme_capacity_bytes = nvme.capacity_bytes;
    out.nvme_used_bytes = nvme.used_bytes;
    out.nvme_blocks = nvme.blocks;
  }
  out.leases = s.leases.size();
  out.zombie_blocks = s.zombies;
  return out;
}

void TierStore::abort_reservation(uint64_t lease) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  auto it = s.leases.find(lease);
  if (it == s.leases.end() || !it->second.reservation) return;  // already ended by release_peer
  s.end_lease(it);
  s.update_gauges();
}

void TierStore::release_read(uint64_t lease) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  auto it = s.leases.find(lease);
  if (it == s.leases.end() || it->second.reservation) return;  // already ended by release_peer
  s.end_lease(it);
  s.update_gauges();
}

}  // namespace lazykv::kvstore
