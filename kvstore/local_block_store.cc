#include "kvstore/local_block_store.h"

#include <cstring>

#include "common/error.h"

namespace lazykv::kvstore {

LocalBlockStore::LocalBlockStore(TierStoreOptions options) : options_(options), store_(std::move(options)) {}

void LocalBlockStore::put(const BlockKey& key, std::span<const uint8_t> bytes, BlockHint hint) {
  PutReservation reservation = store_.reserve_put(kSelf, key, bytes.size(), hint);
  std::memcpy(reservation.buffer().data(), bytes.data(), bytes.size());
  if (!store_.commit_put(std::move(reservation), block_checksum(bytes))) {
    throw Error(ErrorCode::kNotFound, "block " + key.to_string() + ": its sequence was dropped while it was stored");
  }
}

size_t LocalBlockStore::get(const BlockKey& key, std::span<uint8_t> out, BlockHint hint) {
  const ReadLease lease = store_.get(kSelf, key, hint);
  return copy_block_bytes(key, lease.bytes(), out);
}

size_t LocalBlockStore::get_rows(const BlockKey& key, const RowSelection& selection, std::span<uint8_t> out,
                                 BlockHint hint) {
  return copy_block_bytes(key, store_.get_rows(kSelf, key, hint, selection), out);
}

bool LocalBlockStore::drop(const BlockKey& key) { return store_.drop(key); }

size_t LocalBlockStore::drop_sequence(uint64_t model_fingerprint, uint64_t sequence) {
  return store_.drop_sequence(model_fingerprint, sequence);
}

std::string LocalBlockStore::describe() const {
  std::string text = "in-process host tier (" + std::to_string(options_.host_capacity_bytes >> 20) + " MiB, " +
                     options_.replacement + ")";
  if (!options_.nvme_path.empty()) text += " + nvme tier at " + options_.nvme_path;
  return text;
}

}  // namespace lazykv::kvstore
