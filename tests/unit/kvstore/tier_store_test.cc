#include "kvstore/tier_store.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/metrics/metric_names.h"
#include "common/metrics/registry.h"
#include "tests/unit/temp_dir.h"

namespace lazykv::kvstore {
namespace {

constexpr uint64_t kUnit = 4096;
constexpr uint64_t kFingerprint = 0xfeed;

BlockKey key_of(uint64_t sequence, uint32_t position) {
  return BlockKey{kFingerprint, sequence, 1, 2, position, 16};
}

// The bytes of version `version` of `key`: distinct for every (key, version).
std::vector<uint8_t> payload(const BlockKey& key, uint64_t version, size_t bytes = kUnit) {
  std::vector<uint8_t> out(bytes);
  uint64_t state = key.sequence * 0x9e3779b97f4a7c15ull ^ key.first_position * 0xbf58476d1ce4e5b9ull ^ version;
  for (size_t i = 0; i < bytes; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<uint8_t>(state >> 56);
  }
  return out;
}

TierStoreOptions host_only(uint64_t blocks, std::string replacement = "lru") {
  TierStoreOptions options;
  options.host_capacity_bytes = blocks * kUnit;
  options.host_alloc_unit = kUnit;
  options.replacement = std::move(replacement);
  return options;
}

TierStoreOptions with_nvme(uint64_t blocks, const TempDir& dir, std::string replacement = "lru") {
  TierStoreOptions options = host_only(blocks, std::move(replacement));
  options.nvme_path = dir.file("nvme");
  options.nvme_capacity_bytes = 1 << 20;
  return options;
}

BlockHint in_steps(uint64_t steps) { return BlockHint{steps}; }

void put(TierStore& store, const BlockKey& key, const std::vector<uint8_t>& bytes, BlockHint hint = in_steps(1),
         PeerId peer = 1) {
  PutReservation reservation = store.reserve_put(peer, key, bytes.size(), hint);
  ASSERT_EQ(reservation.buffer().size(), bytes.size());
  std::memcpy(reservation.buffer().data(), bytes.data(), bytes.size());
  ASSERT_TRUE(store.commit_put(std::move(reservation), block_checksum(bytes)));
}

std::vector<uint8_t> read(TierStore& store, const BlockKey& key, BlockHint hint = in_steps(1)) {
  ReadLease lease = store.get(2, key, hint);
  EXPECT_EQ(lease.checksum(), block_checksum(lease.bytes()));
  return {lease.bytes().begin(), lease.bytes().end()};
}

void expect_error(ErrorCode code, auto&& fn) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

TEST(TierStore, PutCommitGetRoundTrip) {
  TierStore store(host_only(4));
  const BlockKey key = key_of(1, 0);
  const auto bytes = payload(key, 1, 5000);  // not a multiple of the unit
  put(store, key, bytes);
  {
    ReadLease lease = store.get(7, key, in_steps(3));
    ASSERT_TRUE(lease.valid());
    EXPECT_EQ(std::vector<uint8_t>(lease.bytes().begin(), lease.bytes().end()), bytes);
    EXPECT_EQ(lease.checksum(), block_checksum(bytes));
    EXPECT_EQ(store.stats().leases, 1u);
  }
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.leases, 0u);
  EXPECT_EQ(stats.puts, 1u);
  EXPECT_EQ(stats.gets, 1u);
  EXPECT_EQ(stats.host_hits, 1u);
  EXPECT_EQ(stats.host_blocks, 1u);
  EXPECT_EQ(stats.host_used_bytes, 2 * kUnit);
  EXPECT_EQ(stats.host_capacity_bytes, 4 * kUnit);
  EXPECT_EQ(store.host_arena().size(), 4 * kUnit);
  expect_error(ErrorCode::kNotFound, [&] { store.get(7, key_of(1, 16), {}); });
  EXPECT_EQ(store.stats().misses, 1u);
}

// The named rows of a block of K rows then V rows, gathered by hand.
std::vector<uint8_t> rows_of(const std::vector<uint8_t>& block, uint32_t count, const RowSelection& selection) {
  std::vector<uint8_t> out;
  for (size_t half : {size_t(0), size_t(count)}) {
    for (uint32_t row : selection.rows) {
      const auto first = block.begin() + std::ptrdiff_t((half + row) * selection.row_bytes);
      out.insert(out.end(), first, first + selection.row_bytes);
    }
  }
  return out;
}

TEST(TierStore, ARowGetGathersTheNamedRowsAndRefusesSelectionsThatDoNotFit) {
  TierStore store(host_only(4));
  const BlockKey key = key_of(1, 0);  // 16 rows
  const auto bytes = payload(key, 1, 2 * 16 * 64);
  put(store, key, bytes);
  const RowSelection selection{{0, 5, 15}, 64};
  EXPECT_EQ(store.get_rows(2, key, {}, selection), rows_of(bytes, 16, selection));
  EXPECT_EQ(store.stats().leases, 0u) << "the lease ends with the copy";
  for (const RowSelection& bad : {RowSelection{{}, 64}, RowSelection{{3, 3}, 64}, RowSelection{{5, 2}, 64},
                                  RowSelection{{16}, 64}, RowSelection{{0}, 32}, RowSelection{{0}, 0}}) {
    expect_error(ErrorCode::kInvalidArgument, [&] { store.get_rows(2, key, {}, bad); });
  }
  expect_error(ErrorCode::kNotFound, [&] { store.get_rows(2, key_of(1, 16), {}, selection); });
  EXPECT_EQ(store.stats().host_blocks, 1u) << "a refused selection leaves the block";
}

TEST(TierStore, ARowGetOfACorruptHostCopyIsAnIoErrorAndErasesIt) {
  TierStore store(host_only(4));
  const BlockKey key = key_of(1, 0);
  put(store, key, payload(key, 1, 2 * 16 * 64));
  store.host_arena()[100] ^= 0x10;  // the only block starts the arena
  expect_error(ErrorCode::kIo, [&] { store.get_rows(2, key, {}, RowSelection{{1}, 64}); });
  EXPECT_EQ(store.stats().host_blocks, 0u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(2, key, {}); });
}

TEST(TierStore, RejectsEmptyAndOversizedPuts) {
  TierStore store(host_only(2));
  expect_error(ErrorCode::kInvalidArgument, [&] { store.reserve_put(1, key_of(1, 0), 0, {}); });
  expect_error(ErrorCode::kOutOfMemory, [&] { store.reserve_put(1, key_of(1, 0), 2 * kUnit + 1, {}); });
  EXPECT_EQ(store.stats().leases, 0u);
}

TEST(TierStore, ChecksumMismatchFreesTheSpace) {
  TierStore store(host_only(2));
  const BlockKey key = key_of(1, 0);
  const auto bytes = payload(key, 1);
  PutReservation reservation = store.reserve_put(1, key, bytes.size(), {});
  std::memcpy(reservation.buffer().data(), bytes.data(), bytes.size());
  expect_error(ErrorCode::kInvalidArgument,
               [&] { store.commit_put(std::move(reservation), block_checksum(bytes) ^ 1); });
  EXPECT_FALSE(reservation.valid());
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.host_used_bytes, 0u);
  EXPECT_EQ(stats.leases, 0u);
  EXPECT_EQ(stats.host_blocks, 0u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key, {}); });
}

TEST(TierStore, AbandonedReservationIsAborted) {
  TierStore store(host_only(2));
  {
    PutReservation reservation = store.reserve_put(1, key_of(1, 0), kUnit, {});
    PutReservation moved = std::move(reservation);
    EXPECT_FALSE(reservation.valid());
    EXPECT_TRUE(moved.valid());
    EXPECT_EQ(store.stats().host_used_bytes, kUnit);
  }
  EXPECT_EQ(store.stats().host_used_bytes, 0u);
  EXPECT_EQ(store.stats().leases, 0u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, 0), {}); });
}

TEST(TierStore, PutReplacesTheBlockOfTheSameKey) {
  TierStore store(host_only(4));
  const BlockKey key = key_of(1, 0);
  put(store, key, payload(key, 1));
  put(store, key, payload(key, 2));
  EXPECT_EQ(read(store, key), payload(key, 2));
  EXPECT_EQ(store.stats().host_blocks, 1u);
  EXPECT_EQ(store.stats().host_used_bytes, kUnit);
}

TEST(TierStore, WithoutTier2VictimsAreDropped) {
  TierStore store(host_only(2));
  for (uint32_t i = 0; i < 3; ++i) put(store, key_of(1, i), payload(key_of(1, i), 1));
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.dropped_victims, 1u);
  EXPECT_EQ(stats.nvme_admitted + stats.nvme_rejected, 0u);
  EXPECT_EQ(stats.host_blocks, 2u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, 0), {}); });  // LRU: the oldest went
  EXPECT_EQ(read(store, key_of(1, 2)), payload(key_of(1, 2), 1));
}

TEST(TierStore, SpillsToTier2AndPromotesWithTheSameBytes) {
  TempDir dir;
  TierStore store(with_nvme(4, dir));
  constexpr uint32_t kBlocks = 12;
  for (uint32_t i = 0; i < kBlocks; ++i) put(store, key_of(1, i), payload(key_of(1, i), 1), in_steps(5));
  TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.nvme_admitted, kBlocks - 4);
  EXPECT_EQ(stats.dropped_victims, 0u);
  EXPECT_EQ(stats.host_blocks, 4u);
  EXPECT_EQ(stats.nvme_blocks, kBlocks - 4);
  EXPECT_EQ(stats.nvme_used_bytes, (kBlocks - 4) * kUnit);
  // Every block comes back, most of them from tier 2, each promotion
  // demoting another block (tiers are exclusive: the total stays 12).
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(read(store, key_of(1, i), in_steps(5)), payload(key_of(1, i), 1)) << i;
    stats = store.stats();
    EXPECT_EQ(stats.host_blocks + stats.nvme_blocks, kBlocks);
  }
  stats = store.stats();
  EXPECT_EQ(stats.nvme_hits, kBlocks);  // LRU over a cyclic scan longer than the pool misses every time
  EXPECT_EQ(stats.host_hits, 0u);
  EXPECT_EQ(stats.host_used_bytes, 4 * kUnit);
}

TEST(TierStore, AdmissionRuleSendsNearVictimsToTier2AndDropsFarOnes) {
  TempDir dir;
  TierStoreOptions options = with_nvme(2, dir);  // LRU: victims leave in put order
  options.nvme_admit_horizon_steps = 100;
  TierStore store(options);
  const BlockKey never = key_of(1, 0), far = key_of(1, 1), near = key_of(1, 2), filler = key_of(1, 3);
  put(store, never, payload(never, 1), BlockHint{});  // never predicted again
  put(store, far, payload(far, 1), in_steps(1000));
  put(store, near, payload(near, 1), in_steps(50));    // evicts `never`
  put(store, filler, payload(filler, 1), in_steps(1));  // evicts `far`
  TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.nvme_rejected, 2u);
  EXPECT_EQ(stats.dropped_victims, 2u);
  EXPECT_EQ(stats.nvme_admitted, 0u);
  put(store, key_of(1, 4), payload(key_of(1, 4), 1), in_steps(1));  // evicts `near`, within the horizon
  stats = store.stats();
  EXPECT_EQ(stats.nvme_admitted, 1u);
  EXPECT_EQ(stats.nvme_blocks, 1u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, never, {}); });
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, far, {}); });
  EXPECT_EQ(read(store, near), payload(near, 1));
  EXPECT_EQ(store.stats().nvme_hits, 1u);
}

// One block in each tier; block i of sequence 1, version 1, put with a hint.
TierStoreOptions one_block_each(const TempDir& dir) {
  TierStoreOptions options = with_nvme(1, dir);
  options.nvme_capacity_bytes = kUnit;
  return options;
}
void put_block(TierStore& store, uint32_t i, uint64_t steps) {
  put(store, key_of(1, i), payload(key_of(1, i), 1), in_steps(steps));
}

TEST(TierStore, AFullTier2RejectsAVictimNeededLaterThanEveryBlockItHolds) {
  TempDir dir;
  TierStore store(one_block_each(dir));
  put_block(store, 0, 50);
  put_block(store, 1, 90);  // 0 goes to tier 2
  put_block(store, 2, 90);  // 1 is needed after 0: dropped
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.nvme_admitted, 1u);
  EXPECT_EQ(stats.nvme_rejected, 1u);
  EXPECT_EQ(stats.dropped_victims, 1u);
  EXPECT_EQ(stats.nvme_evicted, 0u);
  EXPECT_EQ(read(store, key_of(1, 0)), payload(key_of(1, 0), 1));  // in tier 2
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, 1), {}); });
}

TEST(TierStore, AnOverdueVictimDisplacesNoBlockThatIsStillDue) {
  TempDir dir;
  TierStore store(one_block_each(dir));
  put_block(store, 0, 1000);
  put_block(store, 1, 1);  // 0 goes to tier 2
  // The clock (one per request) passes 1's predicted use: misses tick it.
  for (int i = 0; i < 5; ++i) expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(9, 9), {}); });
  put_block(store, 2, 1);  // 1, overdue, would displace 0, still due: dropped instead
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.nvme_evicted, 0u);
  EXPECT_EQ(stats.nvme_rejected, 1u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, 1), {}); });
  EXPECT_EQ(read(store, key_of(1, 0)), payload(key_of(1, 0), 1));
}

TEST(TierStore, BlocksRecoveredFromTier2GiveWayToNewVictims) {
  TempDir dir;
  {
    TierStore store(one_block_each(dir));
    put_block(store, 0, 10);
    put_block(store, 1, 10);  // 0 goes to tier 2
  }
  TierStore store(one_block_each(dir));  // 0 recovered, its next use unknown
  put_block(store, 2, 10);
  put_block(store, 3, 10);  // 2 takes 0's place
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.nvme_evicted, 1u);
  EXPECT_EQ(stats.nvme_admitted, 1u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, 0), {}); });
  EXPECT_EQ(read(store, key_of(1, 2)), payload(key_of(1, 2), 1));
}

TEST(TierStore, AFullTier2EvictsTheFurthestThenTheOverdueForNearerVictims) {
  TempDir dir;
  TierStore store(one_block_each(dir));
  put_block(store, 0, 1000);
  put_block(store, 1, 10);    // 0 goes to tier 2
  put_block(store, 2, 3000);  // 1, needed sooner, replaces 0 there
  TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.nvme_admitted, 2u);
  EXPECT_EQ(stats.nvme_evicted, 1u);
  EXPECT_EQ(stats.nvme_rejected, 0u);
  EXPECT_EQ(stats.nvme_blocks, 1u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, 0), {}); });
  // The clock (one per request here) passes 1's predicted use without a read of it.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(read(store, key_of(1, 2), in_steps(3000)), payload(key_of(1, 2), 1));
  put_block(store, 3, 1);  // 2, needed after 1 was, replaces it
  stats = store.stats();
  EXPECT_EQ(stats.nvme_admitted, 3u);
  EXPECT_EQ(stats.nvme_evicted, 2u);
  EXPECT_EQ(stats.nvme_used_bytes, kUnit);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, 1), {}); });
  // 2 comes back from tier 2, displacing 3, which tier 2 has no room for:
  // the block being promoted is never what tier 2 evicts (ASan caught that).
  EXPECT_EQ(read(store, key_of(1, 2)), payload(key_of(1, 2), 1));
  stats = store.stats();
  EXPECT_EQ(stats.nvme_blocks, 0u);
  EXPECT_EQ(stats.nvme_evicted, 2u);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, 3), {}); });
}

TEST(TierStore, LeasedBlocksAreNeverEvicted) {
  TierStore store(host_only(3, "follow-prediction"));
  std::vector<ReadLease> leases;
  for (uint32_t i = 0; i < 3; ++i) {
    put(store, key_of(1, i), payload(key_of(1, i), 1));
    leases.push_back(store.get(1, key_of(1, i), {}));
  }
  expect_error(ErrorCode::kOutOfMemory, [&] { store.reserve_put(1, key_of(2, 0), kUnit, {}); });
  TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.host_blocks, 3u);
  EXPECT_EQ(stats.dropped_victims, 0u);
  EXPECT_EQ(stats.leases, 3u);

  // All three were read with no predicted reuse. Release blocks 1 and 2 and
  // put: the victim must be one of them, never the leased block 0.
  leases[1].release();
  leases[2].release();
  EXPECT_FALSE(leases[1].valid());
  put(store, key_of(2, 0), payload(key_of(2, 0), 1), in_steps(1));
  stats = store.stats();
  EXPECT_EQ(stats.dropped_victims, 1u);
  EXPECT_EQ(std::vector<uint8_t>(leases[0].bytes().begin(), leases[0].bytes().end()), payload(key_of(1, 0), 1));
  leases.clear();
  EXPECT_EQ(read(store, key_of(1, 0)), payload(key_of(1, 0), 1));
  EXPECT_EQ(store.stats().leases, 0u);
}

TEST(TierStore, DropWhileLeasedKeepsBytesUntilRelease) {
  TierStore store(host_only(3));
  const BlockKey key = key_of(1, 0);
  put(store, key, payload(key, 1));
  ReadLease lease = store.get(1, key, {});
  EXPECT_TRUE(store.drop(key));
  EXPECT_FALSE(store.drop(key));
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key, {}); });
  TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.zombie_blocks, 1u);
  EXPECT_EQ(stats.host_blocks, 0u);
  EXPECT_EQ(stats.host_used_bytes, kUnit);
  // Churn through the rest of the pool: the zombie's memory is not reused.
  for (uint32_t i = 1; i < 8; ++i) put(store, key_of(1, i), payload(key_of(1, i), 1));
  EXPECT_EQ(std::vector<uint8_t>(lease.bytes().begin(), lease.bytes().end()), payload(key, 1));
  EXPECT_EQ(lease.checksum(), block_checksum(payload(key, 1)));
  // A new put of the key is a new block, not the zombie.
  put(store, key, payload(key, 2));
  EXPECT_EQ(read(store, key), payload(key, 2));
  EXPECT_EQ(std::vector<uint8_t>(lease.bytes().begin(), lease.bytes().end()), payload(key, 1));
  lease.release();
  stats = store.stats();
  EXPECT_EQ(stats.zombie_blocks, 0u);
  EXPECT_EQ(stats.leases, 0u);
  EXPECT_EQ(stats.host_used_bytes, stats.host_blocks * kUnit);
  EXPECT_EQ(stats.host_blocks, 2u);
}

TEST(TierStore, DropSequenceDuringAnInFlightPutDiscardsIt) {
  TierStore store(host_only(4));
  const BlockKey key = key_of(5, 0);
  const auto bytes = payload(key, 1);
  PutReservation reservation = store.reserve_put(1, key, bytes.size(), {});
  put(store, key_of(5, 16), payload(key_of(5, 16), 1));
  put(store, key_of(6, 0), payload(key_of(6, 0), 1));
  EXPECT_EQ(store.drop_sequence(kFingerprint, 5), 1u);  // the published block; the in-flight one is cancelled
  std::memcpy(reservation.buffer().data(), bytes.data(), bytes.size());
  EXPECT_FALSE(store.commit_put(std::move(reservation), block_checksum(bytes)));
  TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.leases, 0u);
  EXPECT_EQ(stats.host_blocks, 1u);
  EXPECT_EQ(stats.host_used_bytes, kUnit);
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key, {}); });
  EXPECT_EQ(read(store, key_of(6, 0)), payload(key_of(6, 0), 1));
  // A put that starts after the drop is unaffected.
  put(store, key, bytes);
  EXPECT_EQ(read(store, key), bytes);
}

TEST(TierStore, DropSequenceCoversBothTiers) {
  TempDir dir;
  TierStore store(with_nvme(2, dir));
  for (uint32_t i = 0; i < 3; ++i) put(store, key_of(1, i), payload(key_of(1, i), 1));  // one spills
  put(store, key_of(2, 0), payload(key_of(2, 0), 1));                                     // another spills
  ASSERT_EQ(store.stats().nvme_blocks, 2u);
  EXPECT_EQ(store.drop_sequence(kFingerprint, 1), 3u);
  EXPECT_EQ(store.drop_sequence(kFingerprint, 1), 0u);
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.host_blocks + stats.nvme_blocks, 1u);
  EXPECT_EQ(stats.host_used_bytes, stats.host_blocks * kUnit);
  for (uint32_t i = 0; i < 3; ++i) {
    expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(1, i), {}); });
  }
  EXPECT_EQ(read(store, key_of(2, 0)), payload(key_of(2, 0), 1));
}

TEST(TierStore, DropModelDropsEverySequenceOfOneFingerprintInBothTiers) {
  TempDir dir;
  TierStore store(with_nvme(2, dir));
  const BlockKey other{kFingerprint + 1, 1, 1, 2, 0, 16};  // another worker's: stays
  put(store, other, payload(other, 1));
  for (uint64_t s = 1; s <= 3; ++s) put(store, key_of(s, 0), payload(key_of(s, 0), 1));  // two spill
  ASSERT_EQ(store.stats().nvme_blocks, 2u);
  EXPECT_EQ(store.drop_model(kFingerprint), 3u);
  EXPECT_EQ(store.drop_model(kFingerprint), 0u);
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.host_blocks + stats.nvme_blocks, 1u);
  for (uint64_t s = 1; s <= 3; ++s) expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(s, 0), {}); });
  EXPECT_EQ(read(store, other), payload(other, 1));
}

TEST(TierStore, DropModelGoesInBatchesUntilNothingIsLeft) {
  TierStore store(host_only(5000));
  for (uint64_t s = 0; s < 5000; ++s) put(store, key_of(s, 0), payload(key_of(s, 0), 1));  // more than one batch
  EXPECT_EQ(store.drop_model(kFingerprint), 5000u);
  EXPECT_EQ(store.stats().host_blocks, 0u);
  EXPECT_EQ(store.stats().host_used_bytes, 0u);
}

TEST(TierStore, ReleasePeerEndsItsLeasesAndLaterDestructionIsHarmless) {
  TierStore store(host_only(4));
  put(store, key_of(1, 0), payload(key_of(1, 0), 1));
  put(store, key_of(1, 1), payload(key_of(1, 1), 1));
  {
    PutReservation reservation = store.reserve_put(10, key_of(1, 2), kUnit, {});
    PutReservation second = store.reserve_put(10, key_of(1, 3), kUnit, {});
    ReadLease read0 = store.get(10, key_of(1, 0), {});
    ReadLease read1 = store.get(10, key_of(1, 1), {});
    ReadLease other = store.get(11, key_of(1, 1), {});
    EXPECT_EQ(store.stats().leases, 5u);
    EXPECT_EQ(store.release_peer(10), 4u);
    TierStoreStats stats = store.stats();
    EXPECT_EQ(stats.leases, 1u);
    EXPECT_EQ(stats.host_used_bytes, 2 * kUnit);  // the reservations' space is free
    EXPECT_EQ(store.release_peer(10), 0u);
    // The freed space can be reserved again while the dead peer's handles live.
    PutReservation third = store.reserve_put(11, key_of(1, 4), kUnit, {});
    EXPECT_FALSE(store.commit_put(std::move(second), 0));  // ended by release_peer
    read0.release();
    EXPECT_EQ(store.stats().leases, 2u);
    EXPECT_TRUE(store.drop(key_of(1, 1)));  // leased only by peer 11 now
    EXPECT_EQ(store.stats().zombie_blocks, 1u);
  }  // `reservation`, `read1` are no-ops; `other` ends the zombie, `third` aborts
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.leases, 0u);
  EXPECT_EQ(stats.zombie_blocks, 0u);
  EXPECT_EQ(stats.host_blocks, 1u);
  EXPECT_EQ(stats.host_used_bytes, kUnit);
  EXPECT_EQ(read(store, key_of(1, 0)), payload(key_of(1, 0), 1));
}

// guard (follow-prediction while it is right) evicts the block predicted
// furthest; lru evicts the one used longest ago.
TEST(TierStore, ReplacementPolicyIsSelectedByName) {
  for (const std::string name : {"guard", "lru"}) {
    TierStore store(host_only(2, name));
    put(store, key_of(1, 0), payload(key_of(1, 0), 1), in_steps(1));  // oldest, needed soon
    put(store, key_of(1, 1), payload(key_of(1, 1), 1), BlockHint{});   // never needed
    put(store, key_of(1, 2), payload(key_of(1, 2), 1), in_steps(1));
    const BlockKey gone = name == "guard" ? key_of(1, 1) : key_of(1, 0);
    const BlockKey kept = name == "guard" ? key_of(1, 0) : key_of(1, 1);
    expect_error(ErrorCode::kNotFound, [&] { store.get(1, gone, {}); });
    EXPECT_EQ(read(store, kept), payload(kept, 1)) << name;
  }
  expect_error(ErrorCode::kInvalidArgument, [] { TierStore store(host_only(2, "fifo")); });
}

TEST(TierStore, ReopenRecoversTier2Blocks) {
  TempDir dir;
  {
    TierStore store(with_nvme(2, dir));
    for (uint32_t i = 0; i < 5; ++i) put(store, key_of(3, i), payload(key_of(3, i), 1), in_steps(2));
    ASSERT_EQ(store.stats().nvme_blocks, 3u);
  }
  TierStore store(with_nvme(2, dir));
  TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.nvme_blocks, 3u);
  EXPECT_EQ(stats.host_blocks, 0u);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(read(store, key_of(3, i)), payload(key_of(3, i), 1)) << i;
  // Tier 1 is volatile: the blocks that were only there are gone.
  for (uint32_t i = 3; i < 5; ++i) {
    expect_error(ErrorCode::kNotFound, [&] { store.get(1, key_of(3, i), {}); });
  }
  EXPECT_EQ(store.drop_sequence(kFingerprint, 3), 3u);
  stats = store.stats();
  EXPECT_EQ(stats.nvme_blocks + stats.host_blocks, 0u);
  EXPECT_EQ(stats.host_used_bytes, 0u);
}

TEST(TierStore, CorruptTier2BlockIsAnIoErrorAndErased) {
  TempDir dir;
  const BlockKey key = key_of(4, 0);
  {
    TierStore store(with_nvme(1, dir));
    put(store, key, payload(key, 1));
    put(store, key_of(4, 1), payload(key_of(4, 1), 1));  // spills `key`
    ASSERT_EQ(store.stats().nvme_blocks, 1u);
  }
  {  // Flip the last byte of the stored value (the block's last byte).
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.file("nvme"), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const auto encoded = encode_block_key(key);
    const rocksdb::Slice slice(reinterpret_cast<const char*>(encoded.data()), encoded.size());
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), slice, &value).ok());
    value.back() = static_cast<char>(value.back() ^ 0x40);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), slice, value).ok());
    ASSERT_TRUE(db->Close().ok());
  }
  TierStore store(with_nvme(1, dir));
  expect_error(ErrorCode::kIo, [&] { store.get(1, key, {}); });
  expect_error(ErrorCode::kNotFound, [&] { store.get(1, key, {}); });
  const TierStoreStats stats = store.stats();
  EXPECT_EQ(stats.nvme_blocks, 0u);
  EXPECT_EQ(stats.host_used_bytes, 0u);
  EXPECT_EQ(stats.leases, 0u);
}

TEST(TierStore, ExportsTierMetrics) {
  TempDir dir;
  metrics::Registry registry;
  TierStoreOptions options = with_nvme(2, dir);
  options.metrics = &registry;
  options.nvme_admit_horizon_steps = 10;
  TierStore store(options);
  put(store, key_of(1, 0), payload(key_of(1, 0), 1), in_steps(1));
  put(store, key_of(1, 1), payload(key_of(1, 1), 1), BlockHint{});
  put(store, key_of(1, 2), payload(key_of(1, 2), 1), in_steps(1));  // key 0 -> nvme
  put(store, key_of(1, 3), payload(key_of(1, 3), 1), in_steps(1));  // key 1 rejected
  ReadLease lease = store.get(1, key_of(1, 0), in_steps(1));       // promoted, evicting key 2 to nvme
  using namespace metrics;
  EXPECT_EQ(registry.gauge(kKvBytes, {"host"}).value(), 2.0 * kUnit);
  EXPECT_EQ(registry.gauge(kKvBytes, {"nvme"}).value(), 1.0 * kUnit);
  EXPECT_EQ(registry.gauge(kKvCapacityBytes, {"host"}).value(), 2.0 * kUnit);
  EXPECT_EQ(registry.gauge(kKvCapacityBytes, {"nvme"}).value(), double(1 << 20));
  EXPECT_EQ(registry.gauge(kKvstoreBlocks, {"host"}).value(), 2.0);
  EXPECT_EQ(registry.gauge(kKvstoreBlocks, {"nvme"}).value(), 1.0);
  EXPECT_EQ(registry.gauge(kKvstoreLeases).value(), 1.0);
  EXPECT_EQ(registry.gauge(kKvstorePoolFragmentation).value(), 0.0);
  EXPECT_EQ(registry.counter(kKvstoreNvmeAdmissions, {"admitted"}).value(), 2.0);
  EXPECT_EQ(registry.counter(kKvstoreNvmeAdmissions, {"rejected"}).value(), 1.0);
  EXPECT_EQ(registry.counter(kTransferBytes, {"host", "nvme"}).value(), 2.0 * kUnit);
  EXPECT_EQ(registry.counter(kTransferBytes, {"nvme", "host"}).value(), 1.0 * kUnit);
  EXPECT_EQ(registry.histogram(kTransferDuration, {"host", "nvme"}).snapshot().count, 2u);
  EXPECT_EQ(registry.histogram(kTransferDuration, {"nvme", "host"}).snapshot().count, 1u);
  lease.release();
  EXPECT_EQ(registry.gauge(kKvstoreLeases).value(), 0.0);
}

}  // namespace
}  // namespace lazykv::kvstore
