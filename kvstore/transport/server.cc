// Server side of the messenger: a listener, one endpoint per client, and the
// request path (header by eager AM, payload by rendezvous into the memory
// the payload sink chooses). Everything UCX runs on the progress thread;
// Responder::reply from other threads is posted to it.
#include <atomic>
#include <cstring>
#include <iostream>
#include <mutex>
#include <unordered_map>

#include "kvstore/transport/messenger.h"
#include "kvstore/transport/messenger_util.h"
#include "kvstore/transport/progress_loop.h"
#include "kvstore/transport/transport_config.h"
#include "kvstore/transport/wire.h"

namespace lazykv::transport {

namespace {

struct ServerImpl;

// What a Responder needs after the Server may be gone: a pointer that the
// server clears (under the mutex) before it shuts down.
struct ServerLink {
  std::mutex mutex;
  ServerImpl* server = nullptr;
};

struct ReplyWork {
  PeerId peer = 0;
  uint64_t request_id = 0;
  uint32_t status = 0;
  std::vector<uint8_t> header;
  std::span<const uint8_t> payload;
  std::function<void(bool)> on_sent;
};

void send_reply_via(const std::shared_ptr<ServerLink>& link, ReplyWork work);

}  // namespace

struct Responder::State {
  std::shared_ptr<ServerLink> link;
  PeerId peer = 0;
  uint64_t request_id = 0;
  std::atomic<bool> replied{false};

  ~State() {
    if (replied.exchange(true)) return;
    ReplyWork work;
    work.peer = peer;
    work.request_id = request_id;
    work.status = kStatusInternal;
    send_reply_via(link, std::move(work));
  }
};

void Responder::reply(uint32_t status, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                      std::function<void(bool sent)> on_sent) {
  if (!state_) throw Error(ErrorCode::kInternal, "kvstore reply on an empty Responder");
  if (state_->replied.exchange(true)) {
    throw Error(ErrorCode::kInternal, "kvstore request " + std::to_string(state_->request_id) + " answered twice");
  }
  ReplyWork work;
  work.peer = state_->peer;
  work.request_id = state_->request_id;
  work.status = status;
  work.header.assign(header.begin(), header.end());
  work.payload = payload;
  work.on_sent = std::move(on_sent);
  send_reply_via(state_->link, std::move(work));
}

namespace {

struct Peer {
  PeerId id = 0;
  std::string address;
  std::unique_ptr<UcxEndpoint> ep;
  std::string transport;  // set at the client's hello
  metrics::Gauge* gauge = nullptr;
};

// A reply being sent; owns the encoded header until UCX is done with it.
struct OutgoingReply {
  ServerImpl* server = nullptr;
  uint64_t key = 0;
  std::vector<uint8_t> wire;
  std::function<void(bool)> on_sent;
};

// A request whose payload is being received into the sink's buffer.
struct IncomingPayload {
  ServerImpl* server = nullptr;
  uint64_t key = 0;
  PeerId peer = 0;
  uint64_t request_id = 0;
  uint32_t op = 0;
  std::vector<uint8_t> header;
  std::span<uint8_t> payload;
  std::shared_ptr<void> token;
};

struct ServerImpl {
  TransportOptions options;
  ServerHandlers handlers;
  std::unique_ptr<ProgressLoop> loop;
  std::unique_ptr<UcxListener> listener;
  uint16_t port = 0;
  std::shared_ptr<ServerLink> link = std::make_shared<ServerLink>();
  RegisteredMemory memory;

  // Progress-thread state.
  PeerId next_peer = 1;
  uint64_t next_key = 1;
  std::unordered_map<PeerId, Peer> peers;
  std::unordered_map<ucp_ep_h, PeerId> peer_by_ep;
  std::vector<NbxResult> closing;  // endpoint closes in flight
  std::unordered_map<uint64_t, std::unique_ptr<OutgoingReply>> replies;
  std::unordered_map<uint64_t, std::unique_ptr<IncomingPayload>> incoming;
  std::atomic<size_t> peer_count{0};

  ServerImpl(TransportOptions opts, const std::string& host, uint16_t listen_port, ServerHandlers h)
      : options(std::move(opts)), handlers(std::move(h)) {
    loop = std::make_unique<ProgressLoop>(options);
    set_am_handler(loop->worker(), wire::kAmRequest, &ServerImpl::on_request_am, this);

    const sockaddr_storage address = resolve_address(host, listen_port, ErrorCode::kIo);
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
    params.sockaddr.addrlen = address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    params.conn_handler.cb = &ServerImpl::on_connection;
    params.conn_handler.arg = this;
    try {
      listener = std::make_unique<UcxListener>(loop->worker(), params);
    } catch (const Error& e) {
      throw Error(ErrorCode::kIo, "kvstore server cannot listen on " + host + ":" + std::to_string(listen_port) +
                                      ": " + e.what());
    }
    port = listener->port();
    {
      std::lock_guard lock(link->mutex);
      link->server = this;
    }
    loop->start([this] { on_tick(); });
  }

  ~ServerImpl() {
    {
      std::lock_guard lock(link->mutex);
      link->server = nullptr;  // replies from now on fail with on_sent(false)
    }
    loop->run_sync([this] {
      listener.reset();
      for (auto& [id, peer] : peers) {
        if (peer.gauge != nullptr) peer.gauge->add(-1);
        closing.push_back(peer.ep->close(/*force=*/true));
      }
      peers.clear();
      peer_by_ep.clear();
      peer_count.store(0);
    });
    // Forced closes cancel every request on the endpoints; wait for their
    // callbacks so no UCX request refers to freed state.
    loop->stop([this] { return closes_done() && replies.empty() && incoming.empty(); }, std::chrono::seconds(2));
    closing.clear();
    memory.clear();
    loop.reset();  // worker and context; late callbacks still find this object
    for (auto& [key, reply] : replies) {
      if (reply->on_sent) reply->on_sent(false);
    }
  }

  bool closes_done() {
    for (const auto& c : closing) {
      if (c.request && ucp_request_check_status(c.request.get()) == UCS_INPROGRESS) return false;
    }
    return true;
  }

  void on_tick() {
    std::erase_if(closing, [](const NbxResult& c) {
      return !c.request || ucp_request_check_status(c.request.get()) != UCS_INPROGRESS;
    });
  }

  static void on_connection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<ServerImpl*>(arg);
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    std::string address = "unknown";
    if (ucp_conn_request_query(request, &attr) == UCS_OK) address = address_text(attr.client_address);

    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &ServerImpl::on_endpoint_error;
    params.err_handler.arg = self;
    try {
      auto ep = std::make_unique<UcxEndpoint>(self->loop->worker(), params);
      const PeerId id = self->next_peer++;
      self->peer_by_ep[ep->get()] = id;
      Peer& peer = self->peers[id];
      peer.id = id;
      peer.address = address;
      peer.ep = std::move(ep);
      self->peer_count.fetch_add(1);
    } catch (const Error& e) {
      // ucp_ep_create consumed (rejected) the request; the client sees an error.
      std::cerr << "[transport] cannot accept kvstore client " << address << ": " << e.what() << "\n";
    }
  }

  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<ServerImpl*>(arg);
    auto it = self->peer_by_ep.find(ep);
    if (it == self->peer_by_ep.end()) return;
    self->lose_peer(it->second, status);
  }

  void lose_peer(PeerId id, ucs_status_t status) {
    auto it = peers.find(id);
    if (it == peers.end()) return;
    Peer peer = std::move(it->second);
    peers.erase(it);
    peer_by_ep.erase(peer.ep->get());
    peer_count.fetch_sub(1);
    if (peer.gauge != nullptr) peer.gauge->add(-1);
    if (status != UCS_ERR_CONNECTION_RESET && status != UCS_ERR_NOT_CONNECTED) {
      std::cerr << "[transport] " << peer_lost_message(peer.address, status) << "\n";
    }
    // Closing from inside the error callback is allowed (the endpoint is
    // already failed); the forced close releases it and cancels its requests.
    closing.push_back(peer.ep->close(/*force=*/true));
    if (handlers.on_peer_lost) {
      try {
        handlers.on_peer_lost(id);
      } catch (const std::exception& e) {
        std::cerr << "[transport] on_peer_lost failed: " << e.what() << "\n";
      }
    }
  }

  static ucs_status_t on_request_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
    auto* self = static_cast<ServerImpl*>(arg);
    self->handle_request(header, header_length, data, length, param);
    // With a rendezvous payload, UCX owns the descriptor from here: either
    // ucp_am_recv_data_nbx was called, or the payload is refused (dropped).
    return UCS_OK;
  }

  void handle_request(const void* header, size_t header_length, void* data, size_t length,
                      const ucp_am_recv_param_t* param) {
    const auto message = wire::decode(header, header_length);
    if (!message || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
      std::cerr << "[transport] dropped a malformed kvstore request\n";
      return;
    }
    auto peer_it = peer_by_ep.find(param->reply_ep);
    if (peer_it == peer_by_ep.end()) return;  // a peer already lost
    const PeerId peer_id = peer_it->second;
    const wire::Header& wh = message->header;

    if (wh.kind == wire::Kind::kHello) {
      // By now UCX has rewired the endpoint to its final lanes: the client's
      // hello waits in its endpoint until the server answered the wireup.
      const auto hello = wire::decode_hello(message->user_header);
      note_transport(peers[peer_id], hello && hello->host == host_identity_hash());
      const auto answer = wire::encode_hello({host_identity_hash()});
      send_reply(peer_id, wh.request_id, kStatusOk, answer, {}, {}, wire::Kind::kHello);
      return;
    }

    std::vector<uint8_t> user_header(message->user_header.begin(), message->user_header.end());
    if (length == 0) {
      dispatch(peer_id, wh.request_id, wh.code, std::move(user_header), {}, {});
      return;
    }

    PayloadSink sink;
    try {
      if (handlers.payload_sink) sink = handlers.payload_sink(peer_id, wh.code, user_header, length);
    } catch (const std::exception& e) {
      std::cerr << "[transport] payload_sink failed: " << e.what() << "\n";
      send_reply(peer_id, wh.request_id, kStatusInternal, {}, {}, {}, wire::Kind::kCall);
      return;
    }
    if (sink.buffer.size() < length) {
      send_reply(peer_id, wh.request_id, kStatusPayloadRefused, {}, {}, {}, wire::Kind::kCall);
      return;
    }
    std::span<uint8_t> target = sink.buffer.first(length);

    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA || !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
      // Sent eagerly after all (the sender forces rendezvous; kept for safety).
      std::memcpy(target.data(), data, length);
      dispatch(peer_id, wh.request_id, wh.code, std::move(user_header), target, std::move(sink.token));
      return;
    }

    auto in = std::make_unique<IncomingPayload>();
    in->server = this;
    in->key = next_key++;
    in->peer = peer_id;
    in->request_id = wh.request_id;
    in->op = wh.code;
    in->header = std::move(user_header);
    in->payload = target;
    in->token = std::move(sink.token);
    const ucp_request_param_t recv_param =
        am_recv_param(&ServerImpl::on_payload_received, in.get(), memory.find(target.data(), target.size()));
    NbxResult started =
        take_nbx(ucp_am_recv_data_nbx(loop->worker(), data, target.data(), target.size(), &recv_param));
    if (started.status == UCS_INPROGRESS) {
      started.request.release();  // freed in the callback
      const uint64_t key = in->key;
      incoming.emplace(key, std::move(in));
    } else if (started.status == UCS_OK) {
      dispatch(in->peer, in->request_id, in->op, std::move(in->header), in->payload, std::move(in->token));
    }  // else: the peer failed; its error callback reports it
  }

  static void on_payload_received(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
    UcxRequest owned(request);
    auto* in = static_cast<IncomingPayload*>(user_data);
    ServerImpl* self = in->server;
    auto it = self->incoming.find(in->key);
    if (it == self->incoming.end()) return;
    std::unique_ptr<IncomingPayload> done = std::move(it->second);
    self->incoming.erase(it);
    if (status != UCS_OK) return;  // the token is released; the peer's loss is reported separately
    self->dispatch(done->peer, done->request_id, done->op, std::move(done->header), done->payload,
                   std::move(done->token));
  }

  void dispatch(PeerId peer, uint64_t request_id, uint32_t op, std::vector<uint8_t> header,
                std::span<uint8_t> payload, std::shared_ptr<void> token) {
    auto state = std::make_shared<Responder::State>();
    state->link = link;
    state->peer = peer;
    state->request_id = request_id;
    ServerRequest request;
    request.peer = peer;
    request.op = op;
    request.header = std::move(header);
    request.payload = payload;
    request.token = std::move(token);
    if (!handlers.on_request) return;  // the Responder answers kStatusInternal
    try {
      handlers.on_request(std::move(request), Responder(std::move(state)));
    } catch (const std::exception& e) {
      // The handler's Responder copy is gone; if it did not reply, the
      // State's destructor answered kStatusInternal.
      std::cerr << "[transport] kvstore request handler failed: " << e.what() << "\n";
    }
  }

  void note_transport(Peer& peer, bool same_host) {
    if (!peer.transport.empty()) return;
    const auto lanes = endpoint_lane_transports(peer.ep->get());
    peer.transport = primary_transport(lanes);
    log_endpoint_transport(peer.address, peer.transport, lanes, options.transports, same_host);
    if (options.metrics != nullptr) {
      peer.gauge = &options.metrics->gauge(metrics::kTransportInfo, {peer.transport});
      peer.gauge->add(1);
    }
  }

  // On the progress thread.
  void send_reply(PeerId peer_id, uint64_t request_id, uint32_t status, std::span<const uint8_t> header,
                  std::span<const uint8_t> payload, std::function<void(bool)> on_sent, wire::Kind kind) {
    auto peer_it = peers.find(peer_id);
    if (peer_it == peers.end()) {
      if (on_sent) on_sent(false);
      return;
    }
    auto out = std::make_unique<OutgoingReply>();
    out->server = this;
    out->key = next_key++;
    wire::Header wh;
    wh.kind = kind;
    wh.request_id = request_id;
    wh.code = status;
    wh.payload_bytes = payload.size();
    out->wire = wire::encode(wh, header);
    out->on_sent = std::move(on_sent);
    const uint32_t flags = payload.empty() ? 0 : UCP_AM_SEND_FLAG_RNDV;
    const ucp_request_param_t param = am_send_param(&ServerImpl::on_reply_sent, out.get(), flags,
                                                    payload.empty() ? nullptr : memory.find(payload.data(), payload.size()));
    NbxResult sent = take_nbx(ucp_am_send_nbx(peer_it->second.ep->get(), wire::kAmReply, out->wire.data(),
                                              out->wire.size(), payload.data(), payload.size(), &param));
    if (sent.status == UCS_INPROGRESS) {
      sent.request.release();  // freed in the callback
      const uint64_t key = out->key;
      replies.emplace(key, std::move(out));
      return;
    }
    if (out->on_sent) out->on_sent(sent.status == UCS_OK);
  }

  static void on_reply_sent(void* request, ucs_status_t status, void* user_data) {
    UcxRequest owned(request);
    auto* out = static_cast<OutgoingReply*>(user_data);
    ServerImpl* self = out->server;
    auto it = self->replies.find(out->key);
    if (it == self->replies.end()) return;
    std::unique_ptr<OutgoingReply> done = std::move(it->second);
    self->replies.erase(it);
    if (done->on_sent) {
      try {
        done->on_sent(status == UCS_OK);
      } catch (const std::exception& e) {
        std::cerr << "[transport] on_sent failed: " << e.what() << "\n";
      }
    }
  }
};

void send_reply_via(const std::shared_ptr<ServerLink>& link, ReplyWork work) {
  std::unique_lock lock(link->mutex);
  ServerImpl* server = link->server;
  if (server == nullptr) {
    lock.unlock();
    if (work.on_sent) work.on_sent(false);
    return;
  }
  if (server->loop->on_progress_thread()) {
    lock.unlock();  // the server cannot go away while its own thread runs this
    server->send_reply(work.peer, work.request_id, work.status, work.header, work.payload, std::move(work.on_sent),
                       wire::Kind::kCall);
    return;
  }
  auto shared = std::make_shared<ReplyWork>(std::move(work));
  const bool posted = server->loop->post([server, shared] {
    server->send_reply(shared->peer, shared->request_id, shared->status, shared->header, shared->payload,
                       std::move(shared->on_sent), wire::Kind::kCall);
  });
  lock.unlock();
  if (!posted && shared->on_sent) shared->on_sent(false);
}

}  // namespace

struct Server::Impl : ServerImpl {
  using ServerImpl::ServerImpl;
};

Server::Server(TransportOptions options, const std::string& host, uint16_t port, ServerHandlers handlers)
    : impl_(std::make_unique<Impl>(std::move(options), host, port, std::move(handlers))) {}

Server::~Server() = default;

uint16_t Server::port() const { return impl_->port; }

void Server::register_memory(std::span<uint8_t> memory) {
  impl_->loop->run_sync([&] { impl_->memory.add(impl_->loop->context(), memory); });
}

size_t Server::peers() const { return impl_->peer_count.load(); }

}  // namespace lazykv::transport
