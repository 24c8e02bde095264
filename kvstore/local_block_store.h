// BlockStore over an in-process TierStore: the kvstore's tiers without a
// transport, for when every role runs in one process.
#pragma once

#include "kvstore/block_store.h"
#include "kvstore/tier_store.h"

namespace lazykv::kvstore {

class LocalBlockStore final : public BlockStore {
 public:
  explicit LocalBlockStore(TierStoreOptions options);

  void put(const BlockKey& key, std::span<const uint8_t> bytes, BlockHint hint) override;
  size_t get(const BlockKey& key, std::span<uint8_t> out, BlockHint hint) override;
  size_t get_rows(const BlockKey& key, const RowSelection& selection, std::span<uint8_t> out,
                  BlockHint hint) override;
  bool drop(const BlockKey& key) override;
  size_t drop_sequence(uint64_t model_fingerprint, uint64_t sequence) override;
  TierStoreStats stats() override { return store_.stats(); }
  std::string describe() const override;
  TierStore& tiers() { return store_; }

 private:
  static constexpr PeerId kSelf = 0;
  TierStoreOptions options_;
  TierStore store_;
};

}  // namespace lazykv::kvstore
