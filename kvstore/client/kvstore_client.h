// What a worker links to reach its node's kvstore: the control plane over
// gRPC (where the data plane listens, stats) and the data plane over UCX
// (put, get, drop of blocks). Blocks are checked end to end: the client
// computes the checksum it sends, and a get is accepted only if the reply
// names the key that was asked for and the bytes match the reply's checksum.
//
// Every failure is an Error, never a hang: a dead kvstore turns into
// Error(kUnavailable) within the transport's peer timeout, and every later
// call fails fast until a new client is made.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvstore/block.h"
#include "kvstore/block_store.h"
#include "kvstore/tier_store.h"
#include "kvstore/transport/messenger.h"
#include "lazykv/kvstore/v1/kvstore.grpc.pb.h"

namespace lazykv::kvstore {

struct KvstoreClientOptions {
  std::string address;  // the kvstore's gRPC control plane, HOST:PORT
  transport::TransportOptions transport;
  std::chrono::milliseconds timeout{5000};  // per call, control and data
};

// Where a client reaches the kvstore's UCX data plane. A kvstore bound to a
// wildcard (0.0.0.0, ::) advertises the wildcard: then the host of the
// control address (as IPv4 for 0.0.0.0, which listens on IPv4 only), or the
// wildcard itself when that address is a gRPC target rather than HOST:PORT.
std::string data_host_for(const std::string& control_address, const std::string& advertised);

class KvstoreClient final : public BlockStore {
 public:
  // Asks the control plane where the data plane is, then connects to it.
  // Error(kUnavailable) if either cannot be reached within the timeout.
  explicit KvstoreClient(KvstoreClientOptions options);
  ~KvstoreClient() override;
  KvstoreClient(const KvstoreClient&) = delete;
  KvstoreClient& operator=(const KvstoreClient&) = delete;

  // Stores a block. Error(kOutOfMemory) if the kvstore has no room,
  // Error(kNotFound) if its sequence was dropped while in flight,
  // Error(kUnavailable) if the kvstore is gone.
  void put(const BlockKey& key, std::span<const uint8_t> bytes, BlockHint hint = {}) override;
  // Reads a block into `out` and returns its size. Error(kNotFound) if the
  // kvstore does not have it; Error(kInvalidArgument) if it does not fit in
  // `out`; Error(kIo) if what came back is not the block asked for (wrong key
  // or checksum); Error(kUnavailable) if the kvstore is gone.
  size_t get(const BlockKey& key, std::span<uint8_t> out, BlockHint hint = {}) override;
  // Only the selected rows, gathered by the kvstore: the bytes that travel.
  size_t get_rows(const BlockKey& key, const RowSelection& selection, std::span<uint8_t> out,
                  BlockHint hint = {}) override;
  bool drop(const BlockKey& key) override;
  size_t drop_sequence(uint64_t model_fingerprint, uint64_t sequence) override;
  std::string describe() const override;  // "kvstore HOST:PORT via TRANSPORT"

  TierStoreStats stats() override;  // control plane
  uint64_t peers();        // data-plane clients the kvstore sees (control plane)
  const ::lazykv::kvstore::v1::InfoReply& info() const { return info_; }
  // Staging memory that blocks are sent from or received into.
  void register_memory(std::span<uint8_t> memory);
  bool connected() const;
  std::string transport() const;  // what UCX chose, e.g. "tcp"

 private:
  ::lazykv::kvstore::v1::StatsReply fetch_stats();
  size_t read(const BlockKey& key, const ::lazykv::kvstore::v1::GetHeader& header, std::span<uint8_t> out);
  transport::Reply call(uint32_t op, const std::vector<uint8_t>& header, std::span<const uint8_t> payload,
                        std::span<uint8_t> reply_buffer, const char* what);

  KvstoreClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<::lazykv::kvstore::v1::Kvstore::Stub> stub_;
  ::lazykv::kvstore::v1::InfoReply info_;
  std::unique_ptr<transport::Client> data_;
};

}  // namespace lazykv::kvstore
