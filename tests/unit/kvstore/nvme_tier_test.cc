#include "kvstore/nvme_tier.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "common/error.h"

namespace lazykv::kvstore {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> pattern_bytes(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 31);
  return bytes;
}

BlockKey key_of(uint64_t sequence, uint32_t layer, uint32_t position = 0) {
  return BlockKey{.model_fingerprint = 0xabcd,
                  .sequence = sequence,
                  .layer = layer,
                  .kv_head = 1,
                  .first_position = position,
                  .count = 16};
}

void expect_error(ErrorCode code, const std::string& fragment, auto&& fn) {
  try {
    fn();
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// Each test gets its own database directory under /tmp, removed afterwards.
class NvmeTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "lazykv_nvme_tier_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    db_path_ = (dir_ / "db").string();
  }
  void TearDown() override {
    tier_.reset();
    fs::remove_all(dir_);
  }

  NvmeTier& open(uint64_t capacity = 1 << 20) {
    tier_.reset();  // a RocksDB directory can be open only once
    tier_ = std::make_unique<NvmeTier>(NvmeTierOptions{.path = db_path_, .capacity_bytes = capacity});
    return *tier_;
  }

  void put(NvmeTier& tier, const BlockKey& key, const std::vector<uint8_t>& bytes) {
    tier.put(key, bytes, block_checksum(bytes));
  }

  // Runs fn on the raw database behind the tier (the tier must be closed).
  template <typename Fn>
  void with_raw_db(Fn&& fn) {
    tier_.reset();
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), db_path_, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    fn(*db);
    ASSERT_TRUE(db->Close().ok());
  }

  fs::path dir_;
  std::string db_path_;
  std::unique_ptr<NvmeTier> tier_;
};

std::string raw_key(const BlockKey& key) {
  const auto encoded = encode_block_key(key);
  return std::string(encoded.begin(), encoded.end());
}

TEST_F(NvmeTierTest, PutGetEraseRoundTrip) {
  NvmeTier& tier = open();
  const auto bytes = pattern_bytes(5000, 7);
  const BlockKey key = key_of(1, 0);
  std::vector<uint8_t> out;
  EXPECT_FALSE(tier.get(key, out));
  put(tier, key, bytes);
  EXPECT_EQ(tier.block_bytes(key), 5000u);
  ASSERT_TRUE(tier.get(key, out));
  EXPECT_EQ(out, bytes);
  EXPECT_EQ(tier.stats().used_bytes, 5000u);
  EXPECT_EQ(tier.stats().blocks, 1u);
  EXPECT_EQ(tier.keys(), std::vector<BlockKey>{key});

  EXPECT_TRUE(tier.erase(key));
  EXPECT_FALSE(tier.erase(key));
  EXPECT_FALSE(tier.get(key, out));
  EXPECT_EQ(tier.block_bytes(key), std::nullopt);
  EXPECT_EQ(tier.stats().used_bytes, 0u);
  EXPECT_EQ(tier.stats().blocks, 0u);
}

TEST_F(NvmeTierTest, EmptyBlockRoundTrips) {
  NvmeTier& tier = open();
  put(tier, key_of(1, 0), {});
  std::vector<uint8_t> out = {1, 2, 3};
  ASSERT_TRUE(tier.get(key_of(1, 0), out));
  EXPECT_TRUE(out.empty());
}

TEST_F(NvmeTierTest, ReplaceAdjustsUsage) {
  NvmeTier& tier = open();
  const BlockKey key = key_of(1, 0);
  put(tier, key, pattern_bytes(3000, 1));
  put(tier, key, pattern_bytes(1000, 2));
  EXPECT_EQ(tier.stats().used_bytes, 1000u);
  EXPECT_EQ(tier.stats().blocks, 1u);
  std::vector<uint8_t> out;
  ASSERT_TRUE(tier.get(key, out));
  EXPECT_EQ(out, pattern_bytes(1000, 2));
}

TEST_F(NvmeTierTest, PutRejectsAChecksumThatDoesNotMatch) {
  NvmeTier& tier = open();
  const auto bytes = pattern_bytes(100, 1);
  expect_error(ErrorCode::kInvalidArgument, "checksum",
               [&] { tier.put(key_of(1, 0), bytes, block_checksum(bytes) ^ 1); });
  EXPECT_EQ(tier.stats().blocks, 0u);
}

TEST_F(NvmeTierTest, CapacityIsEnforced) {
  NvmeTier& tier = open(10000);
  put(tier, key_of(1, 0), pattern_bytes(6000, 1));
  expect_error(ErrorCode::kOutOfMemory, "does not fit", [&] { put(tier, key_of(1, 1), pattern_bytes(4001, 2)); });
  EXPECT_EQ(tier.stats().used_bytes, 6000u);
  EXPECT_EQ(tier.block_bytes(key_of(1, 1)), std::nullopt);
  put(tier, key_of(1, 1), pattern_bytes(4000, 2));  // exactly full
  EXPECT_EQ(tier.stats().used_bytes, 10000u);
  // Replacing a block counts only the difference.
  put(tier, key_of(1, 0), pattern_bytes(5000, 3));
  put(tier, key_of(1, 0), pattern_bytes(6000, 4));
  expect_error(ErrorCode::kOutOfMemory, "does not fit", [&] { put(tier, key_of(1, 0), pattern_bytes(6001, 5)); });
  std::vector<uint8_t> out;
  ASSERT_TRUE(tier.get(key_of(1, 0), out));
  EXPECT_EQ(out, pattern_bytes(6000, 4));  // the rejected put left the old block
}

TEST_F(NvmeTierTest, EraseSequenceLeavesOtherSequences) {
  NvmeTier& tier = open();
  for (uint64_t sequence : {4, 5, 6}) {
    for (uint32_t layer = 0; layer < 3; ++layer) put(tier, key_of(sequence, layer), pattern_bytes(100, 1));
  }
  // Same sequence number under another model fingerprint is another sequence.
  BlockKey other_model = key_of(5, 0);
  other_model.model_fingerprint = 0xabce;
  put(tier, other_model, pattern_bytes(100, 1));

  EXPECT_EQ(tier.erase_sequence(0xabcd, 5), 3u);
  EXPECT_EQ(tier.erase_sequence(0xabcd, 5), 0u);
  EXPECT_EQ(tier.erase_sequence(0xabcd, 99), 0u);
  EXPECT_EQ(tier.stats().blocks, 7u);
  EXPECT_EQ(tier.stats().used_bytes, 700u);
  std::vector<uint8_t> out;
  EXPECT_FALSE(tier.get(key_of(5, 1), out));
  EXPECT_TRUE(tier.get(key_of(4, 2), out));
  EXPECT_TRUE(tier.get(key_of(6, 0), out));
  EXPECT_TRUE(tier.get(other_model, out));

  // Gone from the database too, not only from the accounting.
  open();
  EXPECT_EQ(tier_->stats().blocks, 7u);
  EXPECT_FALSE(tier_->get(key_of(5, 0), out));
}

TEST_F(NvmeTierTest, ReopenRecoversBlocksAndUsage) {
  NvmeTier& tier = open();
  put(tier, key_of(1, 0), pattern_bytes(1000, 1));
  put(tier, key_of(1, 1), pattern_bytes(2000, 2));
  put(tier, key_of(2, 0), pattern_bytes(3000, 3));
  tier.erase(key_of(1, 1));

  NvmeTier& reopened = open();
  EXPECT_EQ(reopened.stats().blocks, 2u);
  EXPECT_EQ(reopened.stats().used_bytes, 4000u);
  EXPECT_EQ(reopened.keys(), (std::vector<BlockKey>{key_of(1, 0), key_of(2, 0)}));
  EXPECT_EQ(reopened.block_bytes(key_of(2, 0)), 3000u);
  std::vector<uint8_t> out;
  ASSERT_TRUE(reopened.get(key_of(2, 0), out));
  EXPECT_EQ(out, pattern_bytes(3000, 3));
}

TEST_F(NvmeTierTest, KeysAreInBlockKeyOrder) {
  NvmeTier& tier = open();
  const std::vector<BlockKey> keys = {key_of(3, 0), key_of(1, 2, 64), key_of(1, 2, 0), key_of(2, 0)};
  for (const auto& key : keys) put(tier, key, pattern_bytes(10, 0));
  std::vector<BlockKey> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(tier.keys(), sorted);
}

TEST_F(NvmeTierTest, DamagedBytesAreDetectedAndErased) {
  NvmeTier& tier = open();
  const BlockKey key = key_of(1, 0);
  put(tier, key, pattern_bytes(4096, 9));
  put(tier, key_of(1, 1), pattern_bytes(4096, 10));
  with_raw_db([&](rocksdb::DB& db) {
    std::string value;
    ASSERT_TRUE(db.Get(rocksdb::ReadOptions(), raw_key(key), &value).ok());
    value.back() ^= 0x10;  // one bit of the block's bytes
    ASSERT_TRUE(db.Put(rocksdb::WriteOptions(), raw_key(key), value).ok());
  });
  NvmeTier& reopened = open();
  std::vector<uint8_t> out;
  expect_error(ErrorCode::kIo, "corrupt block " + key.to_string(), [&] { reopened.get(key, out); });
  EXPECT_FALSE(reopened.get(key, out));
  EXPECT_EQ(reopened.stats().blocks, 1u);
  EXPECT_EQ(reopened.stats().used_bytes, 4096u);
  EXPECT_TRUE(reopened.get(key_of(1, 1), out));  // its neighbour is untouched
  open();
  EXPECT_EQ(tier_->stats().blocks, 1u);  // the erase reached the database
}

TEST_F(NvmeTierTest, ABlockUnderTheWrongKeyIsDetectedAndErased) {
  NvmeTier& tier = open();
  const BlockKey stored = key_of(1, 0);
  const BlockKey moved = key_of(2, 0);
  put(tier, stored, pattern_bytes(512, 3));
  with_raw_db([&](rocksdb::DB& db) {
    // A whole, correctly checksummed value, but written under another key.
    std::string value;
    ASSERT_TRUE(db.Get(rocksdb::ReadOptions(), raw_key(stored), &value).ok());
    ASSERT_TRUE(db.Put(rocksdb::WriteOptions(), raw_key(moved), value).ok());
  });
  NvmeTier& reopened = open();
  EXPECT_EQ(reopened.stats().blocks, 2u);
  std::vector<uint8_t> out;
  expect_error(ErrorCode::kIo, "corrupt block " + moved.to_string(), [&] { reopened.get(moved, out); });
  EXPECT_FALSE(reopened.get(moved, out));
  EXPECT_EQ(reopened.block_bytes(moved), std::nullopt);
  EXPECT_EQ(reopened.stats().used_bytes, 512u);
  ASSERT_TRUE(reopened.get(stored, out));
  EXPECT_EQ(out, pattern_bytes(512, 3));
}

TEST_F(NvmeTierTest, EntriesThatCannotBeBlocksAreDroppedOnOpen) {
  open();
  with_raw_db([&](rocksdb::DB& db) {
    ASSERT_TRUE(db.Put(rocksdb::WriteOptions(), "short key", std::string(100, 'x')).ok());
    ASSERT_TRUE(db.Put(rocksdb::WriteOptions(), raw_key(key_of(1, 0)), "tiny").ok());
  });
  NvmeTier& reopened = open();
  EXPECT_EQ(reopened.stats().blocks, 0u);
  EXPECT_EQ(reopened.stats().used_bytes, 0u);
  with_raw_db([&](rocksdb::DB& db) {
    std::string value;
    EXPECT_TRUE(db.Get(rocksdb::ReadOptions(), "short key", &value).IsNotFound());
  });
}

// Threads putting, reading and erasing their own keys: every read sees the
// bytes that were put, and the shared accounting ends exact.
TEST_F(NvmeTierTest, ConcurrentUseKeepsBlocksAndAccountingExact) {
  NvmeTier& tier = open(64 << 20);
  constexpr int kThreads = 4;
  constexpr uint32_t kBlocksPerThread = 40;
  std::vector<std::thread> threads;
  std::vector<int> mismatches(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> out;
      for (uint32_t i = 0; i < kBlocksPerThread; ++i) {
        const auto bytes = pattern_bytes(1000 + i, static_cast<uint8_t>(t));
        tier.put(key_of(static_cast<uint64_t>(t), i), bytes, block_checksum(bytes));
        if (!tier.get(key_of(static_cast<uint64_t>(t), i), out) || out != bytes) ++mismatches[t];
        if (i % 2 == 1) tier.erase(key_of(static_cast<uint64_t>(t), i));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  uint64_t expected_bytes = 0;
  for (uint32_t i = 0; i < kBlocksPerThread; i += 2) expected_bytes += kThreads * (1000 + i);
  EXPECT_EQ(tier.stats().blocks, kThreads * kBlocksPerThread / 2);
  EXPECT_EQ(tier.stats().used_bytes, expected_bytes);
}

TEST_F(NvmeTierTest, CreatesMissingParentDirectories) {
  const std::string nested = (dir_ / "a" / "b" / "db").string();
  NvmeTier tier(NvmeTierOptions{.path = nested, .sync_writes = true});
  put(tier, key_of(1, 0), pattern_bytes(10, 1));
  EXPECT_TRUE(fs::is_directory(nested));
}

TEST_F(NvmeTierTest, OpeningARegularFileIsAnIoError) {
  const std::string file = (dir_ / "not_a_dir").string();
  std::ofstream(file) << "x";
  expect_error(ErrorCode::kIo, "is not a directory", [&] { NvmeTier tier(NvmeTierOptions{.path = file}); });
}

TEST_F(NvmeTierTest, OpeningADatabaseTwiceIsAnIoErrorFromRocksDb) {
  open();
  expect_error(ErrorCode::kIo, "cannot open RocksDB", [&] { NvmeTier second(NvmeTierOptions{.path = db_path_}); });
}

}  // namespace
}  // namespace lazykv::kvstore
