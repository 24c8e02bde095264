// The kvstore process's services: the data plane (UCX: put, get, drop,
// drop-sequence of single blocks into and out of the TierStore) and the
// control plane (gRPC lazykv.kvstore.v1.Kvstore: info, stats, drop-sequence,
// plus grpc.health.v1).
//
// Leases on the kvstore's end: a put's pool reservation hangs off the
// transport's payload token, so it is aborted if the transfer fails; a get's
// read lease lives until the reply's payload has been sent (or has failed).
// A peer that disconnects or dies has its remaining leases released.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "common/metrics/registry.h"
#include "kvstore/tier_store.h"
#include "kvstore/transport/messenger.h"
#include "lazykv/kvstore/v1/kvstore.grpc.pb.h"

namespace lazykv::kvstore {

struct KvstoreServiceOptions {
  TierStoreOptions tiers;
  transport::TransportOptions transport;
  std::string data_host = "127.0.0.1";  // the UCX listener
  uint16_t data_port = 0;               // 0: any free port
};

class KvstoreService final : public ::lazykv::kvstore::v1::Kvstore::Service {
 public:
  static constexpr const char* kServiceName = "lazykv.kvstore.v1.Kvstore";  // served with common/rpc/grpc_server.h

  // Opens the tiers (recovering tier 2) and starts the UCX listener.
  // `metrics` (may be null) receives the kvstore and transport metrics.
  KvstoreService(KvstoreServiceOptions options, metrics::Registry* metrics);
  ~KvstoreService() override;

  grpc::Status Info(grpc::ServerContext* context, const ::lazykv::kvstore::v1::InfoRequest* request,
                    ::lazykv::kvstore::v1::InfoReply* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const ::lazykv::kvstore::v1::StatsRequest* request,
                     ::lazykv::kvstore::v1::StatsReply* response) override;
  grpc::Status DropSequence(grpc::ServerContext* context, const ::lazykv::kvstore::v1::DropSequenceRequest* request,
                            ::lazykv::kvstore::v1::DropSequenceReply* response) override;

  uint16_t data_port() const;
  TierStore& tiers() { return *tiers_; }
  uint64_t instance_id() const { return instance_id_; }

 private:
  transport::PayloadSink payload_sink(transport::PeerId peer, uint32_t op, std::span<const uint8_t> header,
                                      size_t bytes);
  void on_request(transport::ServerRequest&& request, transport::Responder responder);
  void on_peer_lost(transport::PeerId peer);
  void drop_lost_peers();  // the cleaner thread
  void count(uint32_t op, uint32_t status);

  KvstoreServiceOptions options_;
  metrics::Registry* metrics_;
  const uint64_t instance_id_;
  std::unique_ptr<TierStore> tiers_;
  // The model fingerprints each connected peer put blocks under: when the
  // peer (a worker process) is gone, nobody can read or drop them any more,
  // so the cleaner thread drops them, off the transport's thread (a worker's
  // blocks can be millions, and the other peers' calls must go on).
  std::mutex peers_mutex_;
  std::condition_variable cleaner_wake_;
  std::map<transport::PeerId, std::set<uint64_t>> fingerprints_of_peer_;
  std::deque<std::pair<transport::PeerId, std::set<uint64_t>>> lost_peers_;
  bool stopping_ = false;
  std::thread cleaner_;  // started last in the constructor, joined before the tiers close
  std::unique_ptr<transport::Server> server_;  // after tiers_: stopped before the tiers close
};


}  // namespace lazykv::kvstore
