// libFuzzer target: the kvstore parses data-plane headers from any peer.
// The first byte picks the operation (put, get, drop, drop-sequence); the
// rest is the header, parsed exactly as the service does and applied to a
// real TierStore, with the header bytes themselves as a put's payload.
// lazykv::Error is the expected failure (malformed header, wrong checksum,
// no room, no such block); anything else is a bug. A block that is stored
// must read back byte for byte.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "common/error.h"
#include "kvstore/protocol/data_protocol.h"
#include "kvstore/tier_store.h"

namespace {

namespace pb = ::lazykv::kvstore::v1;
using namespace lazykv::kvstore;

TierStore& store() {
  static TierStore* tiers = [] {
    TierStoreOptions options;
    options.host_capacity_bytes = 4 << 20;
    options.host_alloc_unit = 4096;
    return new TierStore(options);
  }();
  return *tiers;
}

void apply(uint32_t op, std::span<const uint8_t> header) {
  constexpr PeerId kPeer = 7;
  switch (op) {
    case kOpPut: {
      pb::PutHeader put;
      parse(header, &put, "put");
      const BlockKey key = from_proto(put.key());
      PutReservation r = store().reserve_put(kPeer, key, header.size(), BlockHint{put.steps_until_use()});
      std::memcpy(r.buffer().data(), header.data(), header.size());
      // The header's own checksum (usually wrong), then the right one.
      try {
        store().commit_put(std::move(r), put.checksum());
        return;
      } catch (const lazykv::Error&) {
      }
      PutReservation again = store().reserve_put(kPeer, key, header.size(), BlockHint{put.steps_until_use()});
      std::memcpy(again.buffer().data(), header.data(), header.size());
      if (store().commit_put(std::move(again), block_checksum(header))) {
        ReadLease lease = store().get(kPeer, key, BlockHint{});
        if (lease.bytes().size() != header.size() ||
            std::memcmp(lease.bytes().data(), header.data(), header.size()) != 0) {
          std::abort();  // a block read back other than it was stored
        }
      }
      return;
    }
    case kOpGet: {
      pb::GetHeader get;
      parse(header, &get, "get");
      ReadLease lease = store().get(kPeer, from_proto(get.key()), BlockHint{get.steps_until_use()});
      if (block_checksum(lease.bytes()) != lease.checksum()) std::abort();
      return;
    }
    case kOpDrop: {
      pb::DropHeader drop;
      parse(header, &drop, "drop");
      store().drop(from_proto(drop.key()));
      return;
    }
    default: {
      pb::DropSequenceHeader drop;
      parse(header, &drop, "drop_sequence");
      store().drop_sequence(drop.model_fingerprint(), drop.sequence());
      return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  try {
    apply(uint32_t(data[0] % 4) + 1, std::span<const uint8_t>(data + 1, size - 1));
  } catch (const lazykv::Error&) {
  }
  if (store().stats().leases != 0) std::abort();  // every lease ended with its RAII object
  return 0;
}
