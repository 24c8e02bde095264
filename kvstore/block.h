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
#include <vector>

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

// Some rows of a block, for a get that needs only those: a lazy+tiers block
// holds `count` K rows then `count` V rows of `row_bytes` each, and a row
// get returns the named rows in the same layout ([n] K rows, then [n] V).
struct RowSelection {
  std::vector<uint32_t> rows;  // ascending, each < the block's count
  uint32_t row_bytes = 0;
  size_t bytes() const { return 2 * rows.size() * size_t(row_bytes); }
};

// The selected rows of a stored block, after checking the stored bytes
// against the checksum the block was put with. Error(kIo) if they no longer
// match (the copy is corrupt); Error(kInvalidArgument) if the selection does
// not fit the block (empty, out of order or out of range, or a block that is
// not 2 x count rows of row_bytes).
std::vector<uint8_t> gather_block_rows(const BlockKey& key, std::span<const uint8_t> block, uint64_t checksum,
                                       const RowSelection& selection);

// Copies what was read of a block into a caller's buffer; returns the size.
// Error(kInvalidArgument) if it does not fit.
size_t copy_block_bytes(const BlockKey& key, std::span<const uint8_t> bytes, std::span<uint8_t> out);

}  // namespace lazykv::kvstore
