// A demoted KV block: the K and V rows of `count` consecutive cached
// positions of one (layer, KV head) of one sequence, named by a BlockKey and
// protected by a checksum. The kvstore never returns a block whose key or
// checksum does not match what was stored.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace lazykv::kvstore {

struct BlockKey {
  uint64_t model_fingerprint = 0;  // which weights produced the KV (worker-computed)
  uint64_t sequence = 0;           // the sequence's id, unique per worker and model
  uint32_t layer = 0;
  uint32_t kv_head = 0;
  uint32_t first_position = 0;     // position of the block's first token
  uint32_t count = 0;              // tokens in the block
  auto operator<=>(const BlockKey&) const = default;
  std::string to_string() const;   // "fp=… seq=… layer=… head=… pos=…+…"
};

// Encoded keys sort like BlockKey and share a 16-byte (fingerprint, sequence)
// prefix, so one sequence's blocks form a contiguous range in RocksDB.
inline constexpr size_t kEncodedBlockKeyBytes = 32;
inline constexpr size_t kSequencePrefixBytes = 16;
std::array<uint8_t, kEncodedBlockKeyBytes> encode_block_key(const BlockKey& key);  // big-endian fields
std::array<uint8_t, kSequencePrefixBytes> encode_sequence_prefix(uint64_t model_fingerprint, uint64_t sequence);
// Error(kInvalidArgument) unless bytes.size() == kEncodedBlockKeyBytes.
BlockKey decode_block_key(std::span<const uint8_t> bytes);

struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const;
};

// XXH3-64 of the block's bytes.
uint64_t block_checksum(std::span<const uint8_t> bytes);

}  // namespace lazykv::kvstore
