#include "kvstore/service/kvstore_service.h"

#include <chrono>
#include <cstdio>

#include "common/error.h"
#include "common/metrics/metric_names.h"
#include "common/random.h"
#include "kvstore/protocol/data_protocol.h"

namespace lazykv::kvstore {
namespace {

namespace pb = ::lazykv::kvstore::v1;
using Clock = std::chrono::steady_clock;

const char* op_name(uint32_t op) {
  switch (op) {
    case kOpPut: return "put";
    case kOpGet: return "get";
    case kOpDrop: return "drop";
    case kOpDropSequence: return "drop_sequence";
    default: return "unknown";
  }
}

// A put in flight: the pool reservation the payload lands in, and what its
// commit needs. Owned by the transport's payload token, so a failed transfer
// aborts the reservation (RAII).
struct PendingPut {
  PutReservation reservation;
  BlockKey key;
  uint64_t checksum = 0;
  Clock::time_point started;
};

std::vector<uint8_t> reply_header(const std::string& message) {
  pb::ReplyHeader header;
  header.set_message(message);
  return serialize(header);
}

}  // namespace

KvstoreService::KvstoreService(KvstoreServiceOptions options, metrics::Registry* metrics)
    : options_(std::move(options)), metrics_(metrics), instance_id_(random_u64()) {
  options_.tiers.metrics = metrics_;
  options_.transport.metrics = metrics_;
  tiers_ = std::make_unique<TierStore>(options_.tiers);
  transport::ServerHandlers handlers;
  handlers.payload_sink = [this](transport::PeerId peer, uint32_t op, std::span<const uint8_t> header,
                                 size_t bytes) { return payload_sink(peer, op, header, bytes); };
  handlers.on_request = [this](transport::ServerRequest&& request, transport::Responder responder) {
    on_request(std::move(request), std::move(responder));
  };
  handlers.on_peer_lost = [this](transport::PeerId peer) { on_peer_lost(peer); };
  server_ = std::make_unique<transport::Server>(options_.transport, options_.data_host, options_.data_port,
                                                std::move(handlers));
  server_->register_memory(tiers_->host_arena());
  cleaner_ = std::thread([this] { drop_lost_peers(); });
}

KvstoreService::~KvstoreService() {
  server_.reset();  // no transfer may touch the tiers after this
  {
    std::lock_guard lock(peers_mutex_);
    stopping_ = true;
  }
  cleaner_wake_.notify_all();
  cleaner_.join();
  tiers_.reset();
}

uint16_t KvstoreService::data_port() const { return server_->port(); }

void KvstoreService::on_peer_lost(transport::PeerId peer) {
  // Leases first: a put still in flight then fails its commit instead of
  // publishing a block after the drop.
  const size_t ended = tiers_->release_peer(peer);
  if (ended > 0) std::fprintf(stderr, "[kvstore] peer %llu lost: %zu leases released\n", (unsigned long long)peer, ended);
  {
    std::lock_guard lock(peers_mutex_);
    auto it = fingerprints_of_peer_.find(peer);
    if (it == fingerprints_of_peer_.end()) return;
    lost_peers_.emplace_back(peer, std::move(it->second));
    fingerprints_of_peer_.erase(it);
  }
  cleaner_wake_.notify_all();
}

void KvstoreService::drop_lost_peers() {
  std::unique_lock lock(peers_mutex_);
  for (;;) {
    cleaner_wake_.wait(lock, [&] { return stopping_ || !lost_peers_.empty(); });
    if (stopping_) return;
    auto [peer, fingerprints] = std::move(lost_peers_.front());
    lost_peers_.pop_front();
    lock.unlock();
    size_t dropped = 0;
    try {
      for (uint64_t fingerprint : fingerprints) dropped += tiers_->drop_model(fingerprint);
    } catch (const Error& e) {  // a tier-2 write failed: what is left stays until a restart
      std::fprintf(stderr, "[kvstore] dropping the blocks of lost peer %llu failed: %s\n", (unsigned long long)peer,
                   e.what());
    }
    if (dropped > 0) {
      std::fprintf(stderr, "[kvstore] peer %llu lost: %zu blocks dropped\n", (unsigned long long)peer, dropped);
    }
    lock.lock();
  }
}

void KvstoreService::count(uint32_t op, uint32_t status) {
  if (metrics_ == nullptr) return;
  metrics_->counter(metrics::kKvstoreRequests, {op_name(op), status_name(status)}).inc();
}

transport::PayloadSink KvstoreService::payload_sink(transport::PeerId peer, uint32_t op,
                                                    std::span<const uint8_t> header, size_t bytes) {
  if (op != kOpPut) return {};  // only a put carries a payload
  try {
    pb::PutHeader put;
    parse(header, &put, "put");
    auto pending = std::make_shared<PendingPut>();
    pending->key = from_proto(put.key());
    pending->checksum = put.checksum();
    pending->started = Clock::now();
    pending->reservation = tiers_->reserve_put(peer, pending->key, bytes, BlockHint{put.steps_until_use()});
    // A shared block (a prompt block) outlives its peer. The peer's own blocks
    // are dropped by fingerprint when it goes, so a fingerprint must be used
    // for shared blocks only or for a peer's own only (workers use a
    // process's random one for their own).
    if (!put.shared()) {
      std::lock_guard lock(peers_mutex_);
      fingerprints_of_peer_[peer].insert(pending->key.model_fingerprint);
    }
    const std::span<uint8_t> buffer = pending->reservation.buffer().first(bytes);
    return transport::PayloadSink{buffer, std::move(pending)};
  } catch (const Error& e) {
    // The client sees kStatusPayloadRefused (no room, or a bad header).
    std::fprintf(stderr, "[kvstore] put refused: %s\n", e.what());
    count(op, status_for(e.code()));
    return {};
  }
}

void KvstoreService::on_request(transport::ServerRequest&& request, transport::Responder responder) {
  const uint32_t op = request.op;
  uint32_t status = transport::kStatusOk;
  try {
    switch (op) {
      case kOpPut: {
        auto pending = std::static_pointer_cast<PendingPut>(request.token);
        if (!pending) throw Error(ErrorCode::kInvalidArgument, "a put without a payload");
        const uint64_t bytes = request.payload.size();
        const bool kept = tiers_->commit_put(std::move(pending->reservation), pending->checksum);
        status = kept ? transport::kStatusOk : kStatusDiscarded;
        responder.reply(status, reply_header(kept ? "" : "the sequence was dropped while its block was in flight"));
        if (metrics_ != nullptr && kept) {
          metrics_->counter(metrics::kTransferBytes, {"device", "host"}).inc(double(bytes));
          metrics_->histogram(metrics::kTransferDuration, {"device", "host"})
              .observe(std::chrono::duration<double>(Clock::now() - pending->started).count());
        }
        break;
      }
      case kOpGet: {
        pb::GetHeader get;
        parse(request.header, &get, "get");
        const BlockKey key = from_proto(get.key());
        const auto started = Clock::now();
        const BlockHint hint{get.steps_until_use()};
        pb::ReplyHeader header;
        to_proto(key, header.mutable_key());
        // A whole block is sent from the pool under a read lease; a row get
        // sends the rows gathered under a lease that has already ended.
        std::shared_ptr<ReadLease> lease;
        std::shared_ptr<std::vector<uint8_t>> rows;
        if (get.rows_size() > 0) {
          const RowSelection selection{{get.rows().begin(), get.rows().end()}, get.row_bytes()};
          rows = std::make_shared<std::vector<uint8_t>>(tiers_->get_rows(request.peer, key, hint, selection));
        } else {
          lease = std::make_shared<ReadLease>(tiers_->get(request.peer, key, hint));
        }
        const std::span<const uint8_t> bytes = rows ? std::span<const uint8_t>(*rows) : lease->bytes();
        header.set_checksum(rows ? block_checksum(bytes) : lease->checksum());
        metrics::Registry* metrics = metrics_;
        // The lease (or the gathered rows) lives until the payload has left, or the peer is gone.
        responder.reply(transport::kStatusOk, serialize(header), bytes,
                        [lease, rows, size = bytes.size(), metrics, started](bool sent) {
                          if (sent && metrics != nullptr) {
                            metrics->counter(metrics::kTransferBytes, {"host", "device"}).inc(double(size));
                            metrics->histogram(metrics::kTransferDuration, {"host", "device"})
                                .observe(std::chrono::duration<double>(Clock::now() - started).count());
                          }
                          if (lease) lease->release();
                        });
        break;
      }
      case kOpDrop: {
        pb::DropHeader drop;
        parse(request.header, &drop, "drop");
        pb::ReplyHeader header;
        header.set_count(tiers_->drop(from_proto(drop.key())) ? 1 : 0);
        responder.reply(transport::kStatusOk, serialize(header));
        break;
      }
      case kOpDropSequence: {
        pb::DropSequenceHeader drop;
        parse(request.header, &drop, "drop_sequence");
        pb::ReplyHeader header;
        header.set_count(tiers_->drop_sequence(drop.model_fingerprint(), drop.sequence()));
        responder.reply(transport::kStatusOk, serialize(header));
        break;
      }
      default:
        throw Error(ErrorCode::kInvalidArgument, "unknown kvstore operation " + std::to_string(op));
    }
  } catch (const Error& e) {
    status = status_for(e.code());
    responder.reply(status, reply_header(e.what()));
  }
  count(op, status);
}

grpc::Status KvstoreService::Info(grpc::ServerContext*, const pb::InfoRequest*, pb::InfoReply* response) {
  response->set_data_host(options_.data_host);
  response->set_data_port(data_port());
  response->set_transports(options_.transport.transports);
  response->set_host_capacity_bytes(options_.tiers.host_capacity_bytes);
  response->set_nvme_capacity_bytes(options_.tiers.nvme_path.empty() ? 0 : options_.tiers.nvme_capacity_bytes);
  response->set_instance_id(instance_id_);
  response->set_replacement(options_.tiers.replacement);
  response->set_row_gets(true);
  return grpc::Status::OK;
}

grpc::Status KvstoreService::Stats(grpc::ServerContext*, const pb::StatsRequest*, pb::StatsReply* response) {
  to_proto(tiers_->stats(), response);
  response->set_peers(server_->peers());
  return grpc::Status::OK;
}

grpc::Status KvstoreService::DropSequence(grpc::ServerContext*, const pb::DropSequenceRequest* request,
                                          pb::DropSequenceReply* response) {
  response->set_blocks(tiers_->drop_sequence(request->model_fingerprint(), request->sequence()));
  count(kOpDropSequence, transport::kStatusOk);
  return grpc::Status::OK;
}

}  // namespace lazykv::kvstore
