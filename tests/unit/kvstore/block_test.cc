#include "kvstore/block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <unordered_set>
#include <vector>

#include "common/error.h"

namespace lazykv::kvstore {
namespace {

BlockKey sample_key() {
  return BlockKey{.model_fingerprint = 0x0123456789abcdefULL,
                  .sequence = 0xfedcba9876543210ULL,
                  .layer = 17,
                  .kv_head = 3,
                  .first_position = 4096,
                  .count = 256};
}

// Few distinct values per field, so random keys often tie on leading fields
// and the later fields decide the order.
BlockKey random_key(std::mt19937_64& rng) {
  auto pick64 = [&] {
    const uint64_t choices[] = {0, 1, 255, 256, 0x8000000000000000ULL, ~0ULL};
    return choices[rng() % 6];
  };
  auto pick32 = [&] {
    const uint32_t choices[] = {0, 1, 255, 256, 0x80000000u, ~0u};
    return choices[rng() % 6];
  };
  return BlockKey{pick64(), pick64(), pick32(), pick32(), pick32(), pick32()};
}

TEST(BlockKey, EncodeDecodeRoundTrip) {
  const BlockKey key = sample_key();
  const auto encoded = encode_block_key(key);
  EXPECT_EQ(decode_block_key(encoded), key);

  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const BlockKey random{rng(), rng(), static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()),
                          static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
    EXPECT_EQ(decode_block_key(encode_block_key(random)), random);
  }
}

TEST(BlockKey, EncodingIsBigEndianInFieldOrder) {
  const auto encoded = encode_block_key(sample_key());
  const std::array<uint8_t, kEncodedBlockKeyBytes> expected = {
      0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,  // fingerprint
      0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10,  // sequence
      0x00, 0x00, 0x00, 0x11,                          // layer 17
      0x00, 0x00, 0x00, 0x03,                          // head 3
      0x00, 0x00, 0x10, 0x00,                          // position 4096
      0x00, 0x00, 0x01, 0x00};                         // count 256
  EXPECT_EQ(encoded, expected);
}

TEST(BlockKey, EncodingsSortLikeKeys) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 5000; ++i) {
    const BlockKey a = random_key(rng);
    const BlockKey b = random_key(rng);
    const auto ea = encode_block_key(a);
    const auto eb = encode_block_key(b);
    // std::array compares lexicographically as unsigned bytes, like memcmp.
    EXPECT_EQ(a <=> b, ea <=> eb) << a.to_string() << " vs " << b.to_string();
  }
}

TEST(BlockKey, SequencePrefixIsTheKeysFirstSixteenBytes) {
  const BlockKey key = sample_key();
  const auto encoded = encode_block_key(key);
  const auto prefix = encode_sequence_prefix(key.model_fingerprint, key.sequence);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), encoded.begin()));

  BlockKey other_sequence = key;
  other_sequence.sequence += 1;
  const auto other = encode_block_key(other_sequence);
  EXPECT_FALSE(std::equal(prefix.begin(), prefix.end(), other.begin()));
}

TEST(BlockKey, DecodeRejectsWrongSize) {
  const std::vector<uint8_t> short_bytes(kEncodedBlockKeyBytes - 1, 0);
  const std::vector<uint8_t> long_bytes(kEncodedBlockKeyBytes + 1, 0);
  for (const auto* bytes : {&short_bytes, &long_bytes}) {
    try {
      decode_block_key(*bytes);
      FAIL() << "decode accepted " << bytes->size() << " bytes";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST(BlockKey, ToStringNamesEveryField) {
  EXPECT_EQ(sample_key().to_string(),
            "fp=0123456789abcdef seq=18364758544493064720 layer=17 head=3 pos=4096+256");
}

TEST(BlockKey, HashSeparatesKeysThatDifferInOneField) {
  const BlockKey base = sample_key();
  std::vector<BlockKey> keys = {base};
  auto vary = [&](auto member) {
    BlockKey k = base;
    k.*member += 1;
    keys.push_back(k);
  };
  vary(&BlockKey::model_fingerprint);
  vary(&BlockKey::sequence);
  vary(&BlockKey::layer);
  vary(&BlockKey::kv_head);
  vary(&BlockKey::first_position);
  vary(&BlockKey::count);
  std::unordered_set<size_t> hashes;
  for (const auto& k : keys) hashes.insert(BlockKeyHash{}(k));
  EXPECT_EQ(hashes.size(), keys.size());
  EXPECT_EQ(BlockKeyHash{}(base), BlockKeyHash{}(sample_key()));
}

TEST(BlockChecksum, ChangesOnEverySingleBitFlip) {
  std::vector<uint8_t> bytes(512);
  std::mt19937 rng(3);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  const uint64_t original = block_checksum(bytes);
  EXPECT_EQ(block_checksum(bytes), original);  // deterministic
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(block_checksum(bytes), original) << "bit " << bit;
    bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  EXPECT_EQ(block_checksum(bytes), original);
}

TEST(BlockChecksum, EmptyBlockHasTheXxh3OfNothing) {
  // XXH3_64bits of the empty input, seed 0 (the published test vector).
  EXPECT_EQ(block_checksum({}), 0x2D06800538D394C2ULL);
}

}  // namespace
}  // namespace lazykv::kvstore
