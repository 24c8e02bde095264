#include "kvstore/protocol/data_protocol.h"

namespace lazykv::kvstore {

uint32_t status_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::kNotFound: return kStatusNotFound;
    case ErrorCode::kInvalidArgument: return kStatusInvalid;
    case ErrorCode::kOutOfMemory: return kStatusOutOfMemory;
    case ErrorCode::kIo: return kStatusCorrupt;
    default: return transport::kStatusInternal;
  }
}

ErrorCode error_code_for(uint32_t status) {
  switch (status) {
    case kStatusNotFound: return ErrorCode::kNotFound;
    case kStatusInvalid: return ErrorCode::kInvalidArgument;
    case kStatusOutOfMemory:
    case transport::kStatusPayloadRefused: return ErrorCode::kOutOfMemory;
    case kStatusCorrupt: return ErrorCode::kIo;
    case kStatusDiscarded: return ErrorCode::kNotFound;
    default: return ErrorCode::kInternal;
  }
}

std::string status_name(uint32_t status) {
  switch (status) {
    case transport::kStatusOk: return "ok";
    case transport::kStatusInternal: return "internal";
    case transport::kStatusPayloadRefused: return "payload_refused";
    case kStatusNotFound: return "not_found";
    case kStatusInvalid: return "invalid";
    case kStatusOutOfMemory: return "out_of_memory";
    case kStatusCorrupt: return "corrupt";
    case kStatusDiscarded: return "discarded";
    default: return "status_" + std::to_string(status);
  }
}

void to_proto(const BlockKey& key, ::lazykv::kvstore::v1::BlockKey* out) {
  out->set_model_fingerprint(key.model_fingerprint);
  out->set_sequence(key.sequence);
  out->set_layer(key.layer);
  out->set_kv_head(key.kv_head);
  out->set_first_position(key.first_position);
  out->set_count(key.count);
}

BlockKey from_proto(const ::lazykv::kvstore::v1::BlockKey& key) {
  return BlockKey{key.model_fingerprint(), key.sequence(), key.layer(), key.kv_head(), key.first_position(),
                  key.count()};
}

std::vector<uint8_t> serialize(const google::protobuf::MessageLite& message) {
  std::vector<uint8_t> bytes(message.ByteSizeLong());
  if (!message.SerializeToArray(bytes.data(), int(bytes.size()))) {
    throw Error(ErrorCode::kInternal, "could not serialize a kvstore header");
  }
  return bytes;
}

void parse(std::span<const uint8_t> bytes, google::protobuf::MessageLite* message, const char* what) {
  if (!message->ParseFromArray(bytes.data(), int(bytes.size()))) {
    throw Error(ErrorCode::kInvalidArgument, std::string("malformed kvstore ") + what + " header");
  }
}

void to_proto(const TierStoreStats& s, ::lazykv::kvstore::v1::StatsReply* out) {
  out->set_host_capacity_bytes(s.host_capacity_bytes);
  out->set_host_used_bytes(s.host_used_bytes);
  out->set_host_fragmentation(s.host_fragmentation);
  out->set_host_blocks(s.host_blocks);
  out->set_nvme_capacity_bytes(s.nvme_capacity_bytes);
  out->set_nvme_used_bytes(s.nvme_used_bytes);
  out->set_nvme_blocks(s.nvme_blocks);
  out->set_leases(s.leases);
  out->set_zombie_blocks(s.zombie_blocks);
  out->set_puts(s.puts);
  out->set_gets(s.gets);
  out->set_host_hits(s.host_hits);
  out->set_nvme_hits(s.nvme_hits);
  out->set_misses(s.misses);
  out->set_nvme_admitted(s.nvme_admitted);
  out->set_nvme_rejected(s.nvme_rejected);
  out->set_dropped_victims(s.dropped_victims);
  out->set_nvme_evicted(s.nvme_evicted);
}

TierStoreStats from_proto(const ::lazykv::kvstore::v1::StatsReply& r) {
  TierStoreStats s;
  s.host_capacity_bytes = r.host_capacity_bytes();
  s.host_used_bytes = r.host_used_bytes();
  s.host_fragmentation = r.host_fragmentation();
  s.host_blocks = r.host_blocks();
  s.nvme_capacity_bytes = r.nvme_capacity_bytes();
  s.nvme_used_bytes = r.nvme_used_bytes();
  s.nvme_blocks = r.nvme_blocks();
  s.leases = r.leases();
  s.zombie_blocks = r.zombie_blocks();
  s.puts = r.puts();
  s.gets = r.gets();
  s.host_hits = r.host_hits();
  s.nvme_hits = r.nvme_hits();
  s.misses = r.misses();
  s.nvme_admitted = r.nvme_admitted();
  s.nvme_rejected = r.nvme_rejected();
  s.dropped_victims = r.dropped_victims();
  s.nvme_evicted = r.nvme_evicted();
  return s;
}

}  // namespace lazykv::kvstore
