// Client side of the messenger: one endpoint to one Server, many concurrent
// calls. Callers hand their call to the progress thread and sleep until it
// is decided; the progress thread owns the endpoint, the call table and the
// deadlines.
//
// A call ends only once UCX no longer touches the caller's memory: its
// payload send has completed (or failed) and no reply payload is being
// written into the reply sink's buffer. A deadline that passes while a
// transfer is still moving leaves the call waiting for that transfer; if it
// is still stuck peer_timeout later, the peer is declared lost, which
// force-closes the endpoint and ends every transfer.
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "kvstore/transport/messenger.h"
#include "kvstore/transport/messenger_util.h"
#include "kvstore/transport/progress_loop.h"
#include "kvstore/transport/transport_config.h"
#include "kvstore/transport/wire.h"

namespace lazykv::transport {

namespace {

using Clock = std::chrono::steady_clock;
using ReplySink = std::function<std::span<uint8_t>(std::span<const uint8_t>, size_t)>;

struct ClientImpl;

struct PendingCall {
  ClientImpl* client = nullptr;
  uint64_t id = 0;
  uint32_t op = 0;
  wire::Kind kind = wire::Kind::kCall;
  std::vector<uint8_t> wire;  // kept until the send completes
  std::span<const uint8_t> payload;
  const ReplySink* reply_sink = nullptr;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout{0};

  // Progress-thread state.
  bool sending = false;    // UCX may still read `payload`
  bool receiving = false;  // UCX may still write the reply sink's buffer
  std::optional<Reply> reply;
  std::exception_ptr error;

  // Hand-over to the caller.
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;

  bool decided() const { return reply.has_value() || error != nullptr; }
};

struct ClientImpl {
  TransportOptions options;
  std::string peer_address;  // host:port as given
  std::unique_ptr<ProgressLoop> loop;
  RegisteredMemory memory;

  // Progress-thread state.
  std::unique_ptr<UcxEndpoint> ep;
  std::optional<NbxResult> closing;
  std::unordered_map<uint64_t, std::shared_ptr<PendingCall>> calls;
  uint64_t next_id = 1;
  metrics::Gauge* gauge = nullptr;

  std::atomic<bool> connected{false};
  std::atomic<bool> lost{false};
  mutable std::mutex info_mutex;
  std::string transport;
  std::string lost_reason;

  ClientImpl(TransportOptions opts, const std::string& host, uint16_t port)
      : options(std::move(opts)), peer_address(host + ":" + std::to_string(port)) {
    const sockaddr_storage address = resolve_address(host, port, ErrorCode::kUnavailable);
    options.peer_in_other_namespace = !address_in_this_network_namespace(address);
    loop = std::make_unique<ProgressLoop>(options);
    try {
      connect(address);
    } catch (...) {
      shutdown();  // members alone would not stop the thread before freeing the endpoint
      throw;
    }
  }

  void connect(const sockaddr_storage& address) {
    set_am_handler(loop->worker(), wire::kAmReply, &ClientImpl::on_reply_am, this);
    loop->start([this] { on_tick(); });

    loop->run_sync([&] {
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                          UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
      params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
      params.sockaddr.addrlen = address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
      params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      params.err_handler.cb = &ClientImpl::on_endpoint_error;
      params.err_handler.arg = this;
      ep = std::make_unique<UcxEndpoint>(loop->worker(), params);
    });
    connected.store(true);
    // The endpoint exists at once; whether the server is there shows with
    // the first message. A hello round trip proves it within peer_timeout.
    // It also settles the lanes: UCX queues the hello until the endpoint is
    // rewired to its final transports (shm for a peer on this host, when
    // enabled), so the transport is read after it.
    Reply answer;
    try {
      answer = call(0, wire::encode_hello({host_identity_hash()}), {}, nullptr, options.peer_timeout,
                    wire::Kind::kHello);
    } catch (const Error& e) {
      connected.store(false);
      throw Error(ErrorCode::kUnavailable, "cannot connect to kvstore at " + peer_address + ": " + e.what());
    }
    const auto hello = wire::decode_hello(answer.header);
    const bool same_host = hello && hello->host == host_identity_hash();
    loop->run_sync([&] { note_transport(same_host); });
  }

  ~ClientImpl() { shutdown(); }

  void shutdown() {
    if (!loop) return;
    loop->run_sync([this] {
      connected.store(false);
      fail_all(std::make_exception_ptr(Error(ErrorCode::kUnavailable, "kvstore client closed")));
      if (ep) {
        // Graceful close (flush) while the peer is alive, so the server sees
        // a clean disconnect; forced when it is already lost.
        closing = ep->close(/*force=*/lost.load());
        ep.reset();
        release_gauge();
      }
    });
    loop->stop([this] { return close_done() && calls.empty(); },
               std::min<std::chrono::milliseconds>(options.peer_timeout, std::chrono::seconds(2)));
    closing.reset();
    memory.clear();
    loop.reset();  // worker and context; late callbacks still find this object
    for (auto& [id, call] : calls) finish(*call);
  }

  bool close_done() const {
    return !closing || !closing->request || ucp_request_check_status(closing->request.get()) != UCS_INPROGRESS;
  }

  // Any thread but the progress thread.
  Reply call(uint32_t op, std::span<const uint8_t> header, std::span<const uint8_t> payload,
             const ReplySink* reply_sink, std::chrono::milliseconds timeout, wire::Kind kind = wire::Kind::kCall) {
    if (!connected.load()) {
      std::lock_guard lock(info_mutex);
      throw Error(ErrorCode::kUnavailable,
                  lost_reason.empty() ? "kvstore client to " + peer_address + " is not connected" : lost_reason);
    }
    auto pending = std::make_shared<PendingCall>();
    pending->client = this;
    pending->op = op;
    pending->kind = kind;
    pending->payload = payload;
    pending->reply_sink = reply_sink;
    pending->timeout = timeout;
    pending->deadline = Clock::now() + timeout;
    wire::Header wh;
    wh.kind = kind;
    wh.code = op;
    wh.payload_bytes = payload.size();
    pending->wire = wire::encode(wh, header);
    if (!loop->post([this, pending] { start(pending); })) {
      throw Error(ErrorCode::kUnavailable, "kvstore client to " + peer_address + " is shut down");
    }
    std::unique_lock lock(pending->mutex);
    pending->cv.wait(lock, [&] { return pending->done; });
    if (pending->error) std::rethrow_exception(pending->error);
    return std::move(*pending->reply);
  }

  // Progress thread from here on.
  void start(const std::shared_ptr<PendingCall>& pending) {
    if (!ep || lost.load()) {
      std::lock_guard lock(info_mutex);
      pending->error = std::make_exception_ptr(Error(
          ErrorCode::kUnavailable, lost_reason.empty() ? "kvstore client to " + peer_address + " is closed" : lost_reason));
      finish(*pending);
      return;
    }
    pending->id = next_id++;
    std::memcpy(pending->wire.data() + offsetof(wire::Header, request_id), &pending->id, sizeof(pending->id));
    const auto payload = pending->payload;
    uint32_t flags = UCP_AM_SEND_FLAG_REPLY;
    if (!payload.empty()) flags |= UCP_AM_SEND_FLAG_RNDV;
    const ucp_request_param_t param =
        am_send_param(&ClientImpl::on_request_sent, pending.get(), flags,
                      payload.empty() ? nullptr : memory.find(payload.data(), payload.size()));
    calls.emplace(pending->id, pending);
    NbxResult sent = take_nbx(ucp_am_send_nbx(ep->get(), wire::kAmRequest, pending->wire.data(), pending->wire.size(),
                                              payload.data(), payload.size(), &param));
    if (sent.status == UCS_INPROGRESS) {
      sent.request.release();  // freed in the callback
      pending->sending = true;
    } else if (sent.status != UCS_OK) {
      pending->error = std::make_exception_ptr(
          Error(ErrorCode::kUnavailable, "kvstore send to " + peer_address + ": " + ucs_status_string(sent.status)));
      maybe_finish(*pending);
    }
  }

  static void on_request_sent(void* request, ucs_status_t status, void* user_data) {
    UcxRequest owned(request);
    auto* pending = static_cast<PendingCall*>(user_data);
    pending->sending = false;
    if (status != UCS_OK && !pending->decided()) {
      pending->error = std::make_exception_ptr(Error(
          ErrorCode::kUnavailable, peer_lost_message(pending->client->peer_address, status)));
    }
    pending->client->maybe_finish(*pending);
  }

  static ucs_status_t on_reply_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                  const ucp_am_recv_param_t* param) {
    static_cast<ClientImpl*>(arg)->handle_reply(header, header_length, data, length, param);
    return UCS_OK;  // a rendezvous payload not received here is dropped by UCX
  }

  void handle_reply(const void* header, size_t header_length, void* data, size_t length,
                    const ucp_am_recv_param_t* param) {
    const auto message = wire::decode(header, header_length);
    if (!message) {
      std::cerr << "[transport] dropped a malformed kvstore reply from " << peer_address << "\n";
      return;
    }
    auto it = calls.find(message->header.request_id);
    if (it == calls.end() || it->second->decided()) return;  // timed out or failed meanwhile
    PendingCall& pending = *it->second;
    Reply reply;
    reply.status = message->header.code;
    reply.header.assign(message->user_header.begin(), message->user_header.end());
    if (length == 0) {
      pending.reply = std::move(reply);
      maybe_finish(pending);
      return;
    }
    std::span<uint8_t> buffer;
    try {
      if (pending.reply_sink != nullptr && *pending.reply_sink) buffer = (*pending.reply_sink)(reply.header, length);
    } catch (...) {
      pending.error = std::current_exception();
      maybe_finish(pending);
      return;
    }
    if (buffer.empty()) {  // discard the payload
      pending.reply = std::move(reply);
      maybe_finish(pending);
      return;
    }
    if (buffer.size() < length) {
      pending.error = std::make_exception_ptr(
          Error(ErrorCode::kInvalidArgument, "kvstore reply sink gave " + std::to_string(buffer.size()) +
                                                 " bytes for a payload of " + std::to_string(length)));
      maybe_finish(pending);
      return;
    }
    buffer = buffer.first(length);
    reply.payload_bytes = length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA || !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
      std::memcpy(buffer.data(), data, length);  // eager after all
      pending.reply = std::move(reply);
      maybe_finish(pending);
      return;
    }
    pending.reply = std::move(reply);  // final once the payload is in
    pending.receiving = true;
    const ucp_request_param_t recv_param =
        am_recv_param(&ClientImpl::on_reply_payload, &pending, memory.find(buffer.data(), buffer.size()));
    NbxResult started = take_nbx(ucp_am_recv_data_nbx(loop->worker(), data, buffer.data(), buffer.size(), &recv_param));
    if (started.status == UCS_INPROGRESS) {
      started.request.release();  // freed in the callback
      return;
    }
    pending.receiving = false;
    if (started.status != UCS_OK) {
      pending.reply.reset();
      pending.error = std::make_exception_ptr(
          Error(ErrorCode::kUnavailable, peer_lost_message(peer_address, started.status)));
    }
    maybe_finish(pending);
  }

  static void on_reply_payload(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
    UcxRequest owned(request);
    auto* pending = static_cast<PendingCall*>(user_data);
    pending->receiving = false;
    if (status != UCS_OK) {
      pending->reply.reset();
      pending->error = std::make_exception_ptr(
          Error(ErrorCode::kUnavailable, peer_lost_message(pending->client->peer_address, status)));
    }
    pending->client->maybe_finish(*pending);
  }

  // Ends the call if it is decided and UCX is done with the caller's memory.
  void maybe_finish(PendingCall& pending) {
    if (!pending.decided() || pending.sending || pending.receiving) return;
    auto keep = calls.find(pending.id);
    std::shared_ptr<PendingCall> owner;
    if (keep != calls.end()) {
      owner = std::move(keep->second);
      calls.erase(keep);
    }
    finish(pending);
  }

  static void finish(PendingCall& pending) {
    std::lock_guard lock(pending.mutex);
    pending.done = true;
    pending.cv.notify_all();
  }

  void on_tick() {
    if (closing && close_done()) closing.reset();
    if (calls.empty()) return;
    const auto now = Clock::now();
    std::vector<PendingCall*> expired;
    bool stuck = false;
    for (auto& [id, pending] : calls) {
      if (!pending->decided() && !pending->receiving && now >= pending->deadline) {
        expired.push_back(pending.get());
      } else if ((pending->sending || pending->receiving) && now >= pending->deadline + options.peer_timeout) {
        stuck = true;
      }
    }
    for (PendingCall* pending : expired) {
      pending->error = std::make_exception_ptr(Error(
          ErrorCode::kUnavailable, "kvstore call (op " + std::to_string(pending->op) + ") to " + peer_address +
                                       " got no reply within " + std::to_string(pending->timeout.count()) + " ms"));
      maybe_finish(*pending);
    }
    if (stuck) lose_peer(UCS_ERR_ENDPOINT_TIMEOUT);
  }

  static void on_endpoint_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    static_cast<ClientImpl*>(arg)->lose_peer(status);
  }

  void lose_peer(ucs_status_t status) {
    if (lost.exchange(true)) return;
    connected.store(false);
    const std::string reason = peer_lost_message(peer_address, status);
    {
      std::lock_guard lock(info_mutex);
      lost_reason = reason;
    }
    if (!transport.empty()) std::cerr << "[transport] " << reason << "\n";
    fail_all(std::make_exception_ptr(Error(ErrorCode::kUnavailable, reason)));
    if (ep) {
      // Cancels the endpoint's transfers; their callbacks end the calls.
      closing = ep->close(/*force=*/true);
      ep.reset();
    }
    release_gauge();
  }

  void fail_all(const std::exception_ptr& error) {
    std::vector<PendingCall*> open;
    for (auto& [id, pending] : calls) {
      if (!pending->decided()) open.push_back(pending.get());
    }
    for (PendingCall* pending : open) {
      pending->reply.reset();
      pending->error = error;
      maybe_finish(*pending);
    }
  }

  void note_transport(bool same_host) {
    if (!ep) return;
    const auto lanes = endpoint_lane_transports(ep->get());
    const std::string chosen = primary_transport(lanes);
    {
      std::lock_guard lock(info_mutex);
      transport = chosen;
    }
    log_endpoint_transport(peer_address, chosen, lanes, options.transports, same_host);
    if (options.metrics != nullptr) {
      gauge = &options.metrics->gauge(metrics::kTransportInfo, {chosen});
      gauge->add(1);
    }
  }

  void release_gauge() {
    if (gauge != nullptr) gauge->add(-1);
    gauge = nullptr;
  }
};

}  // namespace

struct Client::Impl : ClientImpl {
  using ClientImpl::ClientImpl;
};

Client::Client(TransportOptions options, const std::string& host, uint16_t port)
    : impl_(std::make_unique<Impl>(std::move(options), host, port)) {}

Client::~Client() = default;

Reply Client::call(uint32_t op, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                   const std::function<std::span<uint8_t>(std::span<const uint8_t>, size_t)>& reply_sink,
                   std::chrono::milliseconds timeout) {
  return impl_->call(op, header, payload, &reply_sink, timeout);
}

void Client::register_memory(std::span<uint8_t> memory) {
  impl_->loop->run_sync([&] { impl_->memory.add(impl_->loop->context(), memory); });
}

bool Client::connected() const { return impl_->connected.load(); }

std::string Client::transport() const {
  std::lock_guard lock(impl_->info_mutex);
  return impl_->transport;
}

}  // namespace lazykv::transport
