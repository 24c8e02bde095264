// Where a worker's demoted blocks go: the one interface the worker's tier
// mover calls, implemented by the remote kvstore (KvstoreClient, over UCX)
// and by an in-process TierStore (LocalBlockStore: `lazykv serve`, the eval
// harness and tests, where all roles share one process). Calls block; the
// mover runs them off the decode path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvstore/block.h"
#include "kvstore/tier_store.h"

namespace lazykv::kvstore {

class BlockStore {
 public:
  virtual ~BlockStore() = default;
  // Error(kOutOfMemory): no room; Error(kUnavailable): the store is gone.
  virtual void put(const BlockKey& key, std::span<const uint8_t> bytes, BlockHint hint) = 0;
  // The block's bytes into `out`; returns its size. Error(kNotFound) if the
  // store does not have it; Error(kIo) if it is corrupt; Error(kUnavailable).
  virtual size_t get(const BlockKey& key, std::span<uint8_t> out, BlockHint hint) = 0;
  // Only the selected rows (RowSelection's layout) into `out`; returns their
  // size. The errors of get, and Error(kInvalidArgument) for a selection
  // that does not fit the block.
  virtual size_t get_rows(const BlockKey& key, const RowSelection& selection, std::span<uint8_t> out,
                          BlockHint hint) = 0;
  virtual bool drop(const BlockKey& key) = 0;
  virtual size_t drop_sequence(uint64_t model_fingerprint, uint64_t sequence) = 0;
  // The tiers' counters (blocks and bytes per tier, admissions, hits).
  virtual TierStoreStats stats() = 0;
  // For logs: "kvstore 10.0.0.2:7100 via tcp", "in-process host tier (256 MiB)".
  virtual std::string describe() const = 0;
};

}  // namespace lazykv::kvstore
