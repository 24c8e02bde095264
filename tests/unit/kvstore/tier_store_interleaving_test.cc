// The tier store under random interleavings of every operation from several
// peers, checked against a model after each one (single thread), and the same
// operations from four threads at once checked for what each thread can see.
// Every payload is derived from its key and a version number stored in its
// first bytes, so any served block can be checked on its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kvstore/tier_store.h"
#include "tests/unit/temp_dir.h"

namespace lazykv::kvstore {
namespace {

constexpr uint64_t kUnit = 256;
constexpr uint64_t kPoolUnits = 16;
constexpr uint64_t kFingerprint = 0xabc;
constexpr uint64_t kSequences = 3;
constexpr uint32_t kPositions = 6;
constexpr PeerId kPeers = 3;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

BlockKey key_at(uint64_t sequence, uint32_t position) {
  return BlockKey{kFingerprint, sequence, 0, 0, position * 16, 16};
}

uint64_t seed_of(const BlockKey& key, uint64_t version) {
  return mix(mix(key.sequence * 1000 + key.first_position) ^ version);
}

// 16..kUnit bytes: every block takes exactly one allocation unit, so the
// pool's usage is a count of held blocks.
std::vector<uint8_t> make_payload(const BlockKey& key, uint64_t version) {
  uint64_t state = seed_of(key, version);
  std::vector<uint8_t> out(16 + state % (kUnit - 15));
  std::memcpy(out.data(), &version, sizeof(version));
  for (size_t i = sizeof(version); i < out.size(); ++i) {
    state = mix(state);
    out[i] = static_cast<uint8_t>(state);
  }
  return out;
}

// The version a served block carries, if its bytes are exactly that
// version's payload for `key`.
std::optional<uint64_t> served_version(const BlockKey& key, std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof(uint64_t)) return std::nullopt;
  uint64_t version = 0;
  std::memcpy(&version, bytes.data(), sizeof(version));
  const std::vector<uint8_t> expected = make_payload(key, version);
  if (expected.size() != bytes.size() || std::memcmp(expected.data(), bytes.data(), bytes.size()) != 0) {
    return std::nullopt;
  }
  return version;
}

BlockHint random_hint(std::mt19937_64& rng) {
  return rng() % 4 == 0 ? BlockHint{} : BlockHint{rng() % 200};  // horizon 100: about half are admitted
}

TierStoreOptions options_for(const std::string& replacement, const std::string& nvme_path) {
  TierStoreOptions options;
  options.host_capacity_bytes = kPoolUnits * kUnit;
  options.host_alloc_unit = kUnit;
  options.replacement = replacement;
  options.seed = 7;
  options.nvme_path = nvme_path;
  options.nvme_capacity_bytes = 10 * kUnit;  // fills up: some admitted victims are dropped
  options.nvme_admit_horizon_steps = 100;
  return options;
}

std::optional<ErrorCode> error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;
}

// A seeded random driver with a model of what the store must hold.
class ModelDriver {
 public:
  ModelDriver(TierStore& store, uint64_t seed) : store_(store), rng_(seed) {}

  void step() {
    const uint64_t op = rng_() % 100;
    if (op < 25) {
      reserve();
    } else if (op < 45) {
      commit();
    } else if (op < 50) {
      abort();
    } else if (op < 75) {
      get();
    } else if (op < 90) {
      release_read();
    } else if (op < 95) {
      drop();
    } else if (op < 98) {
      drop_sequence();
    } else {
      release_peer();
    }
  }

  void check() const {
    const TierStoreStats stats = store_.stats();
    ASSERT_EQ(stats.leases, reservations_.size() + reads_.size());
    ASSERT_EQ(stats.zombie_blocks, expected_zombies());
    ASSERT_EQ(stats.host_used_bytes, (stats.host_blocks + stats.zombie_blocks + reservations_.size()) * kUnit);
    ASSERT_LE(stats.host_blocks + stats.nvme_blocks, current_.size());
    ASSERT_GE(stats.host_blocks, live_leased_keys());
    ASSERT_LE(stats.nvme_used_bytes, stats.nvme_capacity_bytes);
  }

  // Ends every lease, checks that nothing leaked, then drops everything.
  void finish() {
    for (const Read& read : reads_) EXPECT_EQ(served_version(read.key, read.handle.bytes()), read.version);
    reads_.clear();
    reservations_.clear();
    TierStoreStats stats = store_.stats();
    EXPECT_EQ(stats.leases, 0u);
    EXPECT_EQ(stats.zombie_blocks, 0u);
    EXPECT_EQ(stats.host_used_bytes, stats.host_blocks * kUnit);
    size_t found = 0;
    for (const auto& [key, version] : current_) {
      try {
        ReadLease lease = store_.get(1, key, {});
        EXPECT_EQ(served_version(key, lease.bytes()), version);
        ++found;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
      }
    }
    EXPECT_GT(found, 0u);
    for (uint64_t sequence = 0; sequence < kSequences; ++sequence) store_.drop_sequence(kFingerprint, sequence);
    stats = store_.stats();
    EXPECT_EQ(stats.host_used_bytes, 0u);
    EXPECT_EQ(stats.host_blocks, 0u);
    EXPECT_EQ(stats.nvme_blocks, 0u);
    EXPECT_EQ(stats.nvme_used_bytes, 0u);
    EXPECT_EQ(stats.leases, 0u);
  }

  const TierStoreStats& totals() const { return totals_; }

 private:
  struct Reservation {
    PeerId peer;
    BlockKey key;
    uint64_t version;
    PutReservation handle;
    bool sequence_dropped = false;
  };
  struct Read {
    PeerId peer;
    BlockKey key;
    uint64_t version;
    ReadLease handle;
  };

  BlockKey random_key() { return key_at(rng_() % kSequences, static_cast<uint32_t>(rng_() % kPositions)); }
  PeerId random_peer() { return 1 + rng_() % kPeers; }

  // Pool units that no eviction can free: reservations and leased blocks.
  size_t pinned_units() const {
    std::set<std::pair<BlockKey, uint64_t>> leased;
    for (const Read& read : reads_) leased.emplace(read.key, read.version);
    return reservations_.size() + leased.size();
  }
  size_t expected_zombies() const {
    std::set<std::pair<BlockKey, uint64_t>> zombies;
    for (const Read& read : reads_) {
      auto it = current_.find(read.key);
      if (it == current_.end() || it->second != read.version) zombies.emplace(read.key, read.version);
    }
    return zombies.size();
  }
  bool live_leased(const BlockKey& key) const {
    auto it = current_.find(key);
    if (it == current_.end()) return false;
    for (const Read& read : reads_) {
      if (read.key == key && read.version == it->second) return true;
    }
    return false;
  }
  size_t live_leased_keys() const {
    std::set<BlockKey> keys;
    for (const Read& read : reads_) {
      if (live_leased(read.key)) keys.insert(read.key);
    }
    return keys.size();
  }

  void reserve() {
    const PeerId peer = random_peer();
    const BlockKey key = random_key();
    const uint64_t version = next_version_++;
    const std::vector<uint8_t> bytes = make_payload(key, version);
    try {
      PutReservation handle = store_.reserve_put(peer, key, bytes.size(), random_hint(rng_));
      ASSERT_EQ(handle.buffer().size(), bytes.size());
      std::memcpy(handle.buffer().data(), bytes.data(), bytes.size());
      reservations_.push_back(Reservation{peer, key, version, std::move(handle)});
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
      ASSERT_EQ(pinned_units(), kPoolUnits);  // only a pool full of leases refuses a put
    }
  }

  void commit() {
    if (reservations_.empty()) return;
    const size_t index = rng_() % reservations_.size();
    Reservation reservation = std::move(reservations_[index]);
    reservations_.erase(reservations_.begin() + static_cast<ptrdiff_t>(index));
    const bool corrupt = rng_() % 10 == 0;
    const uint64_t checksum = block_checksum(make_payload(reservation.key, reservation.version)) ^ (corrupt ? 1 : 0);
    if (reservation.sequence_dropped) {
      ASSERT_FALSE(store_.commit_put(std::move(reservation.handle), checksum));
    } else if (corrupt) {
      ASSERT_EQ(error_of([&] { store_.commit_put(std::move(reservation.handle), checksum); }),
                ErrorCode::kInvalidArgument);
    } else {
      ASSERT_TRUE(store_.commit_put(std::move(reservation.handle), checksum));
      current_[reservation.key] = reservation.version;
      ++totals_.puts;
    }
  }

  void abort() {
    if (reservations_.empty()) return;
    reservations_.erase(reservations_.begin() + static_cast<ptrdiff_t>(rng_() % reservations_.size()));
  }

  void get() {
    const PeerId peer = random_peer();
    const BlockKey key = random_key();
    auto it = current_.find(key);
    try {
      ReadLease lease = store_.get(peer, key, random_hint(rng_));
      ASSERT_NE(it, current_.end()) << "served a block that was never committed or was dropped";
      ASSERT_EQ(served_version(key, lease.bytes()), it->second);
      ASSERT_EQ(lease.checksum(), block_checksum(lease.bytes()));
      reads_.push_back(Read{peer, key, it->second, std::move(lease)});
      ++totals_.gets;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kNotFound) {
        ASSERT_FALSE(live_leased(key)) << "a leased block was evicted";
        if (it != current_.end()) current_.erase(it);  // evicted and not admitted to tier 2
      } else {
        ASSERT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
        ASSERT_EQ(pinned_units(), kPoolUnits);  // a tier-2 block with no room to stage it
      }
    }
  }

  void release_read() {
    if (reads_.empty()) return;
    const size_t index = rng_() % reads_.size();
    Read& read = reads_[index];
    ASSERT_EQ(served_version(read.key, read.handle.bytes()), read.version) << "leased bytes changed";
    if (rng_() % 2 == 0) read.handle.release();  // otherwise the destructor releases it
    reads_.erase(reads_.begin() + static_cast<ptrdiff_t>(index));
  }

  void drop() {
    const BlockKey key = random_key();
    auto it = current_.find(key);
    const bool dropped = store_.drop(key);
    if (it == current_.end()) {
      ASSERT_FALSE(dropped);
      return;
    }
    if (!dropped) {
      ASSERT_FALSE(live_leased(key));
    }
    current_.erase(it);
  }

  void drop_sequence() {
    const uint64_t sequence = rng_() % kSequences;
    size_t known = 0, leased = 0;
    for (const auto& [key, version] : current_) {
      if (key.sequence == sequence) {
        ++known;
        leased += live_leased(key) ? 1 : 0;
      }
    }
    const size_t dropped = store_.drop_sequence(kFingerprint, sequence);
    ASSERT_LE(dropped, known);
    ASSERT_GE(dropped, leased);
    std::erase_if(current_, [&](const auto& entry) { return entry.first.sequence == sequence; });
    for (Reservation& reservation : reservations_) {
      if (reservation.key.sequence == sequence) reservation.sequence_dropped = true;
    }
  }

  void release_peer() {
    const PeerId peer = random_peer();
    const size_t expected = std::count_if(reservations_.begin(), reservations_.end(),
                                          [&](const Reservation& r) { return r.peer == peer; }) +
                            std::count_if(reads_.begin(), reads_.end(), [&](const Read& r) { return r.peer == peer; });
    ASSERT_EQ(store_.release_peer(peer), expected);
    // The handles outlive their leases; destroying them must change nothing.
    std::erase_if(reservations_, [&](const Reservation& r) { return r.peer == peer; });
    std::erase_if(reads_, [&](const Read& r) { return r.peer == peer; });
  }

  TierStore& store_;
  std::mt19937_64 rng_;
  std::map<BlockKey, uint64_t> current_;  // the latest committed version of each key not dropped
  std::vector<Reservation> reservations_;
  std::vector<Read> reads_;
  uint64_t next_version_ = 1;
  TierStoreStats totals_;
};

void run_model(const TierStoreOptions& options, uint64_t seed, int steps) {
  TierStore store(options);
  {
    ModelDriver driver(store, seed);
    for (int i = 0; i < steps; ++i) {
      driver.step();
      driver.check();
      if (testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "at step " << i;
        return;
      }
    }
    const TierStoreStats stats = store.stats();
    // The run exercised what it is meant to.
    EXPECT_GT(driver.totals().puts, 300u);
    EXPECT_GT(stats.dropped_victims, 0u);
    EXPECT_GT(stats.zombie_blocks + stats.leases, 0u);
    if (!options.nvme_path.empty()) {
      EXPECT_GT(stats.nvme_hits, 0u);
      EXPECT_GT(stats.nvme_admitted, 0u);
      EXPECT_GT(stats.nvme_rejected, 0u);
    }
    driver.finish();
  }
}

TEST(TierStoreInterleaving, GuardWithTier2MatchesTheModel) {
  TempDir dir;
  run_model(options_for("guard", dir.file("nvme")), 1, 3000);
}

TEST(TierStoreInterleaving, LruWithTier2MatchesTheModel) {
  TempDir dir;
  run_model(options_for("lru", dir.file("nvme")), 2, 3000);
}

TEST(TierStoreInterleaving, HostOnlyMatchesTheModel) { run_model(options_for("guard", ""), 3, 3000); }

// Four threads, each a peer, on shared keys. Each checks what it can see on
// its own: served bytes are some committed version of the key, leased bytes
// never change, errors are only the expected ones. Then nothing may leak.
TEST(TierStoreInterleaving, ConcurrentPeersLeakNothing) {
  TempDir dir;
  TierStore store(options_for("guard", dir.file("nvme")));
  std::atomic<uint64_t> next_version{1};
  constexpr int kThreads = 4;
  constexpr int kSteps = 1500;
  auto worker = [&](PeerId peer) {
    std::mt19937_64 rng(peer * 101);
    std::vector<PutReservation> reservations;
    struct Held {
      BlockKey key;
      uint64_t version;
      ReadLease lease;
    };
    std::vector<std::pair<BlockKey, uint64_t>> pending;  // (key, version) of each reservation
    std::vector<Held> reads;
    for (int i = 0; i < kSteps; ++i) {
      const uint64_t op = rng() % 100;
      const BlockKey key = key_at(rng() % kSequences, static_cast<uint32_t>(rng() % kPositions));
      if (op < 25) {
        const uint64_t version = next_version++;
        const auto bytes = make_payload(key, version);
        try {
          PutReservation reservation = store.reserve_put(peer, key, bytes.size(), random_hint(rng));
          std::memcpy(reservation.buffer().data(), bytes.data(), bytes.size());
          reservations.push_back(std::move(reservation));
          pending.emplace_back(key, version);
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
        }
      } else if (op < 45 && !reservations.empty()) {
        const size_t index = rng() % reservations.size();
        const bool corrupt = rng() % 10 == 0;
        const auto [committed_key, version] = pending[index];
        const uint64_t checksum = block_checksum(make_payload(committed_key, version)) ^ (corrupt ? 1 : 0);
        PutReservation reservation = std::move(reservations[index]);
        reservations.erase(reservations.begin() + static_cast<ptrdiff_t>(index));
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(index));
        const auto code = error_of([&] {
          const bool published = store.commit_put(std::move(reservation), checksum);
          if (corrupt) {
            EXPECT_FALSE(published);  // only a cancelled put skips the checksum
          }
        });
        if (code) {
          EXPECT_TRUE(corrupt);
          EXPECT_EQ(*code, ErrorCode::kInvalidArgument);
        }
      } else if (op < 50 && !reservations.empty()) {
        const size_t index = rng() % reservations.size();
        reservations.erase(reservations.begin() + static_cast<ptrdiff_t>(index));
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(index));
      } else if (op < 75) {
        try {
          ReadLease lease = store.get(peer, key, random_hint(rng));
          const auto version = served_version(key, lease.bytes());
          ASSERT_TRUE(version.has_value()) << "served bytes are no committed version of " << key.to_string();
          EXPECT_EQ(lease.checksum(), block_checksum(lease.bytes()));
          reads.push_back(Held{key, *version, std::move(lease)});
        } catch (const Error& e) {
          EXPECT_TRUE(e.code() == ErrorCode::kNotFound || e.code() == ErrorCode::kOutOfMemory) << e.what();
        }
      } else if (op < 90 && !reads.empty()) {
        const size_t index = rng() % reads.size();
        EXPECT_EQ(served_version(reads[index].key, reads[index].lease.bytes()), reads[index].version);
        reads.erase(reads.begin() + static_cast<ptrdiff_t>(index));
      } else if (op < 95) {
        store.drop(key);
      } else if (op < 98) {
        store.drop_sequence(kFingerprint, key.sequence);
      } else {
        EXPECT_EQ(store.release_peer(peer), reservations.size() + reads.size());
        reservations.clear();  // no-ops now
        pending.clear();
        reads.clear();
      }
    }
    for (const Held& held : reads) EXPECT_EQ(served_version(held.key, held.lease.bytes()), held.version);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, static_cast<PeerId>(t + 1));
  for (std::thread& thread : threads) thread.join();

  TierStoreStats stats = store.stats();
  EXPECT_GT(stats.puts, 200u);
  EXPECT_EQ(stats.leases, 0u);
  EXPECT_EQ(stats.zombie_blocks, 0u);
  EXPECT_EQ(stats.host_used_bytes, stats.host_blocks * kUnit);
  for (uint64_t sequence = 0; sequence < kSequences; ++sequence) store.drop_sequence(kFingerprint, sequence);
  stats = store.stats();
  EXPECT_EQ(stats.host_used_bytes, 0u);
  EXPECT_EQ(stats.host_blocks + stats.nvme_blocks, 0u);
  EXPECT_EQ(stats.nvme_used_bytes, 0u);
}

}  // namespace
}  // namespace lazykv::kvstore
