// Request/reply messaging over UCX for the kvstore's data plane.
//
// A message is a small header (control: sent as a UCX active message, eager)
// plus an optional payload (a KV block: sent by rendezvous, zero-copy, into
// memory the receiver chooses). A Client multiplexes concurrent calls over
// one endpoint; a Server answers many clients from its progress thread.
//
// Failure is never silent: every UCX status is checked and mapped to
// lazykv::Error; endpoints use UCX peer-failure error handling with
// keepalive, so a dead peer turns into an error within
// TransportOptions::peer_timeout, never a hang. The transport UCX chose for
// each endpoint is logged, counted in lazykv_transport_info{transport}, and a
// fallback to a slow transport (tcp where RDMA was asked for, or where shared
// memory was asked for and the peer runs on the same host) is logged as a
// warning.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/metrics/registry.h"

namespace lazykv::transport {

struct TransportOptions {
  // UCX transports for this context (UCX_TLS syntax), e.g. "tcp", "shm,tcp",
  // "rc,cuda_copy"; empty lets UCX choose. Configuration only: the code is
  // the same for every transport. When shared memory is enabled, peers on
  // one host talk over it (sysv/posix messages, cma blocks) and tcp carries
  // only the connection setup.
  std::string transports;
  // Set by a client toward a peer outside this network namespace: with no
  // transports given and UCX's TLS at its default (no UCX_TLS, no ucx.conf
  // line), shared memory is left out. UCX picks it for any peer on the same
  // host (same boot id), but its wake-ups go through an abstract Unix
  // socket, which does not cross network namespaces, so every call would
  // wait for the progress loop's poll tick (40x slower in the chart's pods);
  // a peer on another host never uses shm anyway.
  bool peer_in_other_namespace = false;
  // A peer that stops answering is declared dead after this long; it also
  // bounds connecting.
  std::chrono::milliseconds peer_timeout{3000};
  metrics::Registry* metrics = nullptr;  // lazykv_transport_info, when set
};

using PeerId = uint64_t;

// Where an incoming payload goes. `token` is kept alive until the request
// has been handled (or has failed), so the owner of the memory (a pool
// reservation) can hang off it and be released by RAII.
struct PayloadSink {
  std::span<uint8_t> buffer;    // exactly the payload size; empty: refuse the payload
  std::shared_ptr<void> token;
};

struct ServerRequest {
  PeerId peer = 0;
  uint32_t op = 0;
  std::vector<uint8_t> header;
  std::span<uint8_t> payload;   // inside the sink's buffer; empty if none
  std::shared_ptr<void> token;  // the sink's token
};

// Answers one request, exactly once (a second reply throws
// Error(kInternal)). Thread-safe; may be called from any thread, after the
// handler returned. The payload's memory must stay valid until `on_sent`
// runs (with false if the peer died first). A Responder destroyed without a
// reply answers with status kStatusInternal.
class Responder {
 public:
  Responder() = default;
  void reply(uint32_t status, std::span<const uint8_t> header, std::span<const uint8_t> payload = {},
             std::function<void(bool sent)> on_sent = {});
  struct State;
  explicit Responder(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

// Reply statuses the transport itself uses; services add their own above.
inline constexpr uint32_t kStatusOk = 0;
inline constexpr uint32_t kStatusInternal = 1;       // handler failed / never replied
inline constexpr uint32_t kStatusPayloadRefused = 2; // the sink refused the payload

struct ServerHandlers {
  // Chooses where a request's payload of `bytes` bytes goes (called on the
  // progress thread before the rendezvous). An empty buffer refuses it: the
  // request is answered with kStatusPayloadRefused and on_request never runs.
  std::function<PayloadSink(PeerId peer, uint32_t op, std::span<const uint8_t> header, size_t bytes)> payload_sink;
  // A complete request (payload received). Runs on the progress thread: do
  // little here, or hand it to another thread with the Responder.
  std::function<void(ServerRequest&& request, Responder responder)> on_request;
  // The peer disconnected or died; its requests in flight have failed.
  std::function<void(PeerId peer)> on_peer_lost;
};

class Server {
 public:
  // Listens on host:port (port 0: any free port). Error(kIo) if it cannot.
  Server(TransportOptions options, const std::string& host, uint16_t port, ServerHandlers handlers);
  ~Server();  // stops the progress thread, closes every endpoint
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  // Registers memory that payloads go to or come from (the host pool's
  // arena), so UCX need not register per transfer. Must outlive the server.
  void register_memory(std::span<uint8_t> memory);
  size_t peers() const;  // connected clients

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct Reply {
  uint32_t status = 0;
  std::vector<uint8_t> header;
  size_t payload_bytes = 0;  // written into the reply sink's buffer
};

class Client {
 public:
  // Connects to a Server. Error(kUnavailable) if it cannot within peer_timeout.
  Client(TransportOptions options, const std::string& host, uint16_t port);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // One request and its reply. `payload` (may be empty) is sent zero-copy
  // and must stay valid until call returns. The reply's payload goes into the
  // buffer `reply_sink` returns for (reply header, payload size); an empty
  // buffer discards it. Thread-safe: concurrent calls share the endpoint.
  // Error(kUnavailable) if the peer is dead or the reply does not come
  // within `timeout`; after a peer failure every call fails fast.
  Reply call(uint32_t op, std::span<const uint8_t> header, std::span<const uint8_t> payload,
             const std::function<std::span<uint8_t>(std::span<const uint8_t> reply_header, size_t bytes)>& reply_sink,
             std::chrono::milliseconds timeout);
  void register_memory(std::span<uint8_t> memory);  // staging buffers; must outlive the client
  bool connected() const;
  std::string transport() const;  // what UCX chose for this endpoint, e.g. "tcp", "shm"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv::transport
