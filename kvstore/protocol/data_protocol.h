// The kvstore data plane on the wire: operation codes, reply statuses, and
// the conversions between kvstore types and their protobuf headers
// (common/proto/lazykv/kvstore/v1/kvstore.proto). Shared by the service and
// the client so both sides speak exactly one protocol.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "kvstore/block.h"
#include "kvstore/tier_store.h"
#include "kvstore/transport/messenger.h"
#include "lazykv/kvstore/v1/kvstore.pb.h"

namespace lazykv::kvstore {

enum DataOp : uint32_t {
  kOpPut = 1,
  kOpGet = 2,
  kOpDrop = 3,
  kOpDropSequence = 4,
};

// Reply statuses above the transport's own (transport::kStatus*).
enum DataStatus : uint32_t {
  kStatusNotFound = 10,
  kStatusInvalid = 11,       // bad header, checksum mismatch
  kStatusOutOfMemory = 12,   // no room in the host tier
  kStatusCorrupt = 13,       // the stored copy failed its checksum (it is gone)
  kStatusDiscarded = 14,     // put: the sequence was dropped while the block was in flight
};

// The status an Error maps to, and back (for the client's exceptions).
uint32_t status_for(ErrorCode code);
ErrorCode error_code_for(uint32_t status);
std::string status_name(uint32_t status);

void to_proto(const BlockKey& key, ::lazykv::kvstore::v1::BlockKey* out);
BlockKey from_proto(const ::lazykv::kvstore::v1::BlockKey& key);

// TierStoreStats <-> the control plane's Stats reply.
void to_proto(const TierStoreStats& stats, ::lazykv::kvstore::v1::StatsReply* out);
TierStoreStats from_proto(const ::lazykv::kvstore::v1::StatsReply& stats);

std::vector<uint8_t> serialize(const google::protobuf::MessageLite& message);
// Parses a header; Error(kInvalidArgument) naming `what` if it is malformed.
void parse(std::span<const uint8_t> bytes, google::protobuf::MessageLite* message, const char* what);

}  // namespace lazykv::kvstore
