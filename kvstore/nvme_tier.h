// Tier 2: demoted blocks in RocksDB at a configured path (NVMe in
// production). The write-ahead log is on, RocksDB checksums every SST block,
// and every value carries the block's own key and XXH3 checksum, verified on
// every read. Capacity is a byte budget over the stored values.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvstore/block.h"

namespace lazykv::kvstore {

struct NvmeTierOptions {
  std::string path;                                  // a directory; created if missing
  uint64_t capacity_bytes = 16ull << 30;             // budget over stored block bytes
  bool sync_writes = false;                          // fsync the WAL on every put (WAL is on either way)
};

struct NvmeTierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;   // block bytes stored
  size_t blocks = 0;
};

class NvmeTier {
 public:
  // Opens the database, or creates it. Blocks already there are recovered
  // (usage is recomputed by scanning). Error(kIo) with RocksDB's message if
  // it cannot be opened.
  explicit NvmeTier(NvmeTierOptions options);
  ~NvmeTier();
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // Stores (or replaces) a block. Error(kOutOfMemory) if it does not fit in
  // the capacity; Error(kIo) on a RocksDB failure.
  void put(const BlockKey& key, std::span<const uint8_t> bytes, uint64_t checksum);
  // Reads a block into `out`. Returns false if absent. Error(kIo) naming the
  // key if the stored key or checksum does not match (the block is erased).
  bool get(const BlockKey& key, std::vector<uint8_t>& out);
  std::optional<uint64_t> block_bytes(const BlockKey& key) const;
  bool erase(const BlockKey& key);
  // Erases every block of one sequence; returns how many.
  size_t erase_sequence(uint64_t model_fingerprint, uint64_t sequence);
  // Erases blocks of any sequence of the fingerprint, at most `limit` (so a
  // caller can release its locks between batches); returns how many.
  size_t erase_model(uint64_t model_fingerprint, size_t limit);
  std::vector<BlockKey> keys() const;
  NvmeTierStats stats() const;

 private:
  // One sequence's blocks, or (no sequence) the fingerprint's; at most `limit`.
  size_t erase_range(uint64_t model_fingerprint, std::optional<uint64_t> sequence, size_t limit);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv::kvstore
