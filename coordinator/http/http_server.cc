#include "coordinator/http/http_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "common/error.h"

namespace lazykv::http {

std::string_view Request::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return value;
  }
  return {};
}

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using beast::error_code;

// Large enough for any sane request line and headers, small enough that a
// client cannot make the server buffer without bound before the body limit.
constexpr size_t kHeaderLimit = 64 * 1024;
// After an error answer the server reads and drops what the client still
// sends for at most this long before closing: closing a socket with unread
// input resets the connection, and the client could lose the answer.
constexpr auto kLingerTime = std::chrono::seconds(2);
// The accept thread lingers much shorter when it turns a connection away.
constexpr auto kRejectLingerTime = std::chrono::milliseconds(100);

std::string to_std(beast::string_view text) { return std::string(text.data(), text.size()); }
beast::string_view to_beast(std::string_view text) { return beast::string_view(text.data(), text.size()); }

std::string default_error_body(int status, const std::string& message) {
  const nlohmann::json body = {
      {"error", {{"message", message}, {"type", status >= 500 ? "server_error" : "invalid_request_error"}}}};
  // Messages may quote client bytes: never fail on invalid UTF-8.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Waits until `fd` reports one of `events` (or hangup/error) or `deadline`
// passes. False on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, timeout_ms);
    if (ready > 0) return true;
    if (ready == 0) {
      if (timeout_ms == 0) return false;
      continue;  // woke a little early: re-check the deadline
    }
    if (errno != EINTR) return true;  // let the next recv/send report the error
  }
}

error_code errno_code(int err) { return error_code(err, boost::system::system_category()); }

// A connected non-blocking socket as a Beast SyncReadStream/SyncWriteStream
// whose every wait is bounded by `timeout`: Asio's own blocking calls wait
// without limit, so an idle or stalled client could hold a thread forever.
// Shutting the socket down (Server::stop) wakes any wait at once.
class SocketStream {
 public:
  SocketStream(int fd, std::chrono::milliseconds timeout) : fd_(fd), timeout_(timeout) {}

  int fd() const { return fd_; }

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, error_code& ec) {
    ec = {};
    net::mutable_buffer target;
    for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers); ++it) {
      target = net::mutable_buffer(*it);
      if (target.size() > 0) break;
    }
    if (target.size() == 0) return 0;
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const ssize_t n = ::recv(fd_, target.data(), target.size(), 0);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) {
        ec = net::error::eof;
        return 0;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ec = errno_code(errno);
        return 0;
      }
      if (!wait_fd(fd_, POLLIN, deadline)) {
        ec = net::error::timed_out;
        return 0;
      }
    }
  }

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

  // Sends as much of `buffers` as one sendmsg() takes (all of a small chunk:
  // one segment on the wire, nothing held back).
  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers, error_code& ec) {
    ec = {};
    constexpr size_t kMaxSegments = 64;
    iovec segments[kMaxSegments];
    size_t count = 0;
    for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers) && count < kMaxSegments;
         ++it) {
      const net::const_buffer buffer(*it);
      if (buffer.size() == 0) continue;
      segments[count].iov_base = const_cast<void*>(buffer.data());
      segments[count].iov_len = buffer.size();
      ++count;
    }
    if (count == 0) return 0;
    msghdr message{};
    message.msg_iov = segments;
    message.msg_iovlen = count;
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const ssize_t n = ::sendmsg(fd_, &message, MSG_NOSIGNAL);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ec = errno_code(errno);
        return 0;
      }
      if (!wait_fd(fd_, POLLOUT, deadline)) {
        ec = net::error::timed_out;
        return 0;
      }
    }
  }

  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers) {
    error_code ec;
    const size_t n = write_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  int fd_;
  std::chrono::milliseconds timeout_;
};

// Ends our side, then reads and drops what the client still sends until it
// closes or `linger` passes, so the client reads our last answer before the
// socket is closed (see kLingerTime).
void linger_close_input(int fd, std::chrono::milliseconds linger) {
  ::shutdown(fd, SHUT_WR);
  const auto deadline = Clock::now() + linger;
  char scratch[16 * 1024];
  for (;;) {
    const ssize_t n = ::recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
    if (n == 0) return;
    if (n > 0) continue;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return;
    if (!wait_fd(fd, POLLIN, deadline)) return;
  }
}

void validate_status(int status) {
  if (status < 100 || status > 999) throw Error(ErrorCode::kInternal, "invalid HTTP status " + std::to_string(status));
}

template <class Body>
void set_common_fields(bhttp::response<Body>& response, std::string_view content_type, const Headers& extra) {
  response.set(bhttp::field::server, "lazykv");
  response.set(bhttp::field::content_type, to_beast(content_type));
  for (const auto& [name, value] : extra) response.insert(to_beast(name), to_beast(value));
}

// The ResponseWriter of one request on one connection.
class ConnectionWriter final : public ResponseWriter {
 public:
  enum class State { kNothingSent, kSent, kStreaming, kStreamEnded };

  // `stopping`: once set, a response no longer offers keep-alive.
  // `head`: the request was HEAD, so the answer has headers only.
  ConnectionWriter(SocketStream& stream, unsigned version, bool keep_alive, bool head,
                   const std::atomic<bool>& stopping)
      : stream_(stream), version_(version), keep_alive_(keep_alive), head_(head), stopping_(stopping) {}

  bool send(int status, std::string_view content_type, std::string body, const Headers& extra) override {
    if (state_ != State::kNothingSent) throw Error(ErrorCode::kInternal, "ResponseWriter::send: a response was already started");
    validate_status(status);
    state_ = State::kSent;
    if (gone_) return false;
    if (stopping_) keep_alive_ = false;
    bhttp::response<bhttp::string_body> response;
    response.version(version_);
    response.result(static_cast<unsigned>(status));
    set_common_fields(response, content_type, extra);
    response.keep_alive(keep_alive_);
    response.body() = std::move(body);
    response.prepare_payload();
    error_code ec;
    if (head_) {
      bhttp::response_serializer<bhttp::string_body> serializer(response);
      bhttp::write_header(stream_, serializer, ec);
    } else {
      bhttp::write(stream_, response, ec);
    }
    return check(ec);
  }

  bool start_stream(int status, std::string_view content_type, const Headers& extra) override {
    if (state_ != State::kNothingSent) {
      throw Error(ErrorCode::kInternal, "ResponseWriter::start_stream: a response was already started");
    }
    validate_status(status);
    state_ = State::kStreaming;
    if (gone_) return false;
    if (stopping_) keep_alive_ = false;
    bhttp::response<bhttp::empty_body> response;
    response.version(version_);
    response.result(static_cast<unsigned>(status));
    set_common_fields(response, content_type, extra);
    // HTTP/1.0 has no chunked encoding: the body then ends when the
    // connection closes.
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;
    response.chunked(chunked_);
    response.keep_alive(keep_alive_);
    bhttp::response_serializer<bhttp::empty_body> serializer(response);
    error_code ec;
    bhttp::write_header(stream_, serializer, ec);
    return check(ec);
  }

  bool write_chunk(std::string_view data) override {
    if (state_ != State::kStreaming) throw Error(ErrorCode::kInternal, "ResponseWriter::write_chunk outside a stream");
    if (gone_) return false;
    if (data.empty() || head_) return true;  // an empty chunk would end the stream
    error_code ec;
    const net::const_buffer payload(data.data(), data.size());
    if (chunked_) {
      net::write(stream_, bhttp::make_chunk(payload), ec);
    } else {
      net::write(stream_, payload, ec);
    }
    return check(ec);
  }

  bool end_stream() override {
    if (state_ != State::kStreaming) throw Error(ErrorCode::kInternal, "ResponseWriter::end_stream outside a stream");
    state_ = State::kStreamEnded;
    if (gone_) return false;
    if (!chunked_ || head_) return true;  // HTTP/1.0: ended by closing the connection
    error_code ec;
    net::write(stream_, bhttp::make_chunk_last(), ec);
    return check(ec);
  }

  bool client_gone() override {
    if (gone_) return true;
    pollfd entry{stream_.fd(), POLLIN | POLLRDHUP, 0};
    if (::poll(&entry, 1, 0) <= 0) return false;
    if (entry.revents & (POLLERR | POLLHUP | POLLNVAL)) {
      gone_ = true;
    } else if (entry.revents & (POLLIN | POLLRDHUP)) {
      // Readable: either the client closed (recv gives 0 or an error) or
      // it already sent its next request (pipelining) and is still there.
      char byte;
      const ssize_t n = ::recv(stream_.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone_ = true;
    }
    return gone_;
  }

  State state() const { return state_; }
  bool gone() const { return gone_; }
  bool keep_alive() const { return keep_alive_; }

 private:
  bool check(const error_code& ec) {
    if (ec) gone_ = true;
    return !gone_;
  }

  SocketStream& stream_;
  unsigned version_;
  bool keep_alive_;
  bool head_;
  const std::atomic<bool>& stopping_;
  bool chunked_ = true;
  bool gone_ = false;
  State state_ = State::kNothingSent;
};

std::string endpoint_text(const tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  const std::string host = address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
  return host + ":" + std::to_string(endpoint.port());
}

Request to_request(bhttp::request<bhttp::string_body>& message, std::string remote) {
  Request request;
  request.method = to_std(message.method_string());
  const std::string target = to_std(message.target());
  const size_t question = target.find('?');
  request.path = target.substr(0, question);
  if (question != std::string::npos) request.query = target.substr(question + 1);
  for (const auto& field : message.base()) {
    std::string name = to_std(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    request.headers.emplace_back(std::move(name), to_std(field.value()));
  }
  request.body = std::move(message.body());
  request.remote = std::move(remote);
  return request;
}

// Errors of a request the client sent wrong (answered 400), as opposed to
// the connection ending or timing out (closed without an answer).
bool is_protocol_error(const error_code& ec) {
  static const auto& http_category = bhttp::make_error_code(bhttp::error::bad_method).category();
  return ec.category() == http_category && ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message &&
         ec != bhttp::error::need_more && ec != bhttp::error::need_buffer;
}

}  // namespace

struct Server::Impl {
  struct Connection {
    int fd = -1;  // -1 once the connection thread closes it
    bool busy = false;  // a handler runs for it
    std::thread thread;
  };

  ServerOptions options;
  Handler handler;
  net::io_context io_context;  // only to own the acceptor; never run
  tcp::acceptor acceptor{io_context};
  int wake_fd = -1;  // eventfd: ends the accept thread's wait
  uint16_t bound_port = 0;

  std::mutex lifecycle_mutex;  // start/stop_accepting/stop
  std::thread accept_thread;
  bool listener_closed = false;

  std::mutex mutex;  // everything below
  std::condition_variable request_done;
  std::map<uint64_t, Connection> connections;
  std::vector<uint64_t> finished;  // ids whose thread ended, to be joined
  uint64_t next_id = 0;
  int open_connections = 0;
  int busy_connections = 0;
  std::atomic<bool> stopping{false};

  std::string error_body(int status, const std::string& message) const {
    return options.error_body ? options.error_body(status, message) : default_error_body(status, message);
  }

  // An answer the server gives itself, after which it closes the connection.
  void reply_and_close(SocketStream& stream, int status, const std::string& message,
                       std::chrono::milliseconds linger) const {
    bhttp::response<bhttp::string_body> response;
    response.version(11);
    response.result(static_cast<unsigned>(status));
    // A 503 (too many connections, shutting down) passes: say when to retry, as every 503 of the API does.
    set_common_fields(response, "application/json", status == 503 ? Headers{{"Retry-After", "1"}} : Headers{});
    response.keep_alive(false);
    response.body() = error_body(status, message);
    response.prepare_payload();
    error_code ec;
    bhttp::write(stream, response, ec);
    if (!ec) linger_close_input(stream.fd(), linger);
  }

  std::chrono::milliseconds linger_time() const {
    return std::min<std::chrono::milliseconds>(kLingerTime, options.idle_timeout);
  }

  void listen() {
    error_code ec;
    auto address = net::ip::make_address(options.host, ec);
    if (ec) {  // a host name: take its first address
      tcp::resolver resolver(io_context);
      const auto results = resolver.resolve(options.host, std::to_string(options.port), ec);
      if (!ec && results.begin() != results.end()) address = results.begin()->endpoint().address();
    }
    const tcp::endpoint endpoint(address, options.port);
    if (!ec) acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (!ec) acceptor.non_blocking(true, ec);
    if (!ec) bound_port = acceptor.local_endpoint(ec).port();
    if (ec) {
      throw Error(ErrorCode::kIo,
                  "cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " + ec.message());
    }
    // Child processes (the tests run curl) must not inherit the listener.
    ::fcntl(acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
    wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd < 0) throw Error(ErrorCode::kIo, std::string("eventfd: ") + std::strerror(errno));
  }

  void accept_loop() {
    for (;;) {
      pollfd waits[2] = {{acceptor.native_handle(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
      // Wakes now and then to join ended connection threads even when no
      // new connection arrives.
      const int ready = ::poll(waits, 2, 1000);
      if (ready < 0 && errno != EINTR) return;
      if (waits[1].revents != 0) return;
      join_finished();
      if (ready <= 0 || waits[0].revents == 0) continue;
      sockaddr_storage peer{};
      socklen_t peer_size = sizeof peer;
      const int fd = ::accept4(acceptor.native_handle(), reinterpret_cast<sockaddr*>(&peer), &peer_size,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: back off instead of spinning on poll().
          pollfd wake{wake_fd, POLLIN, 0};
          ::poll(&wake, 1, 50);
        }
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small chunks go out at once
      tcp::endpoint endpoint;  // IPv4 or IPv6: always fits
      const size_t address_size = std::min<size_t>(peer_size, endpoint.capacity());
      std::memcpy(endpoint.data(), &peer, address_size);
      endpoint.resize(address_size);
      add_connection(fd, endpoint_text(endpoint));
    }
  }

  void add_connection(int fd, std::string remote) {
    std::unique_lock lock(mutex);
    if (open_connections >= options.max_connections || stopping) {
      lock.unlock();
      SocketStream stream(fd, std::chrono::milliseconds(kRejectLingerTime));
      reply_and_close(stream, 503, stopping ? "server is shutting down" : "too many connections", kRejectLingerTime);
      ::close(fd);
      return;
    }
    const uint64_t id = next_id++;
    Connection& connection = connections[id];
    connection.fd = fd;
    ++open_connections;
    try {
      connection.thread = std::thread([this, id, fd, remote = std::move(remote)] { serve_connection(id, fd, remote); });
    } catch (const std::system_error&) {  // no thread to be had
      connections.erase(id);
      --open_connections;
      ::close(fd);
    }
  }

  void serve_connection(uint64_t id, int fd, const std::string& remote) {
    try {
      SocketStream stream(fd, options.idle_timeout);
      serve_requests(id, stream, remote);
    } catch (...) {
      // Only allocation failures get here; the connection just ends.
    }
    {
      std::lock_guard lock(mutex);
      Connection& connection = connections.at(id);
      connection.fd = -1;
      if (connection.busy) {  // a handler threw past the bookkeeping
        connection.busy = false;
        --busy_connections;
        request_done.notify_all();
      }
      --open_connections;
      finished.push_back(id);
    }
    ::close(fd);  // after fd = -1: stop() never shuts down a reused descriptor
  }

  bool begin_request(uint64_t id) {
    std::lock_guard lock(mutex);
    if (stopping) return false;
    connections.at(id).busy = true;
    ++busy_connections;
    return true;
  }

  void end_request(uint64_t id) {
    std::lock_guard lock(mutex);
    connections.at(id).busy = false;
    --busy_connections;
    request_done.notify_all();
  }

  void serve_requests(uint64_t id, SocketStream& stream, const std::string& remote) {
    beast::flat_buffer buffer;  // keeps bytes past one request (pipelining)
    while (!stopping) {
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(kHeaderLimit);
      parser.body_limit(options.max_body_bytes);
      error_code ec;
      bhttp::read_header(stream, buffer, parser, ec);
      if (!ec && !parser.is_done()) {
        const auto expect = parser.get()[bhttp::field::expect];
        if (beast::iequals(expect, "100-continue")) {
          static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
          net::write(stream, net::buffer(kContinue.data(), kContinue.size()), ec);
        }
        if (!ec) bhttp::read(stream, buffer, parser, ec);
      }
      if (ec == bhttp::error::body_limit) {
        reply_and_close(stream, 413, "request body exceeds " + std::to_string(options.max_body_bytes) + " bytes",
                        linger_time());
        return;
      }
      if (ec == bhttp::error::header_limit) {
        reply_and_close(stream, 431, "request header exceeds " + std::to_string(kHeaderLimit) + " bytes",
                        linger_time());
        return;
      }
      if (ec) {
        if (is_protocol_error(ec)) reply_and_close(stream, 400, "malformed HTTP request: " + ec.message(), linger_time());
        return;  // otherwise the client closed, reset or went idle
      }

      auto& message = parser.get();
      const unsigned version = message.version();
      const bool keep_alive = message.keep_alive();
      const bool head = message.method() == bhttp::verb::head;
      const Request request = to_request(message, remote);
      if (!begin_request(id)) {
        reply_and_close(stream, 503, "server is shutting down", linger_time());
        return;
      }
      ConnectionWriter writer(stream, version, keep_alive, head, stopping);
      std::string failure;
      bool failed = false;
      try {
        handler(request, writer);
      } catch (const std::exception& e) {
        failed = true;
        failure = e.what();
      } catch (...) {
        failed = true;
        failure = "unknown exception";
      }
      bool must_close = false;
      try {
        if (writer.state() == ConnectionWriter::State::kNothingSent) {
          const std::string message_text = failed ? "internal error: " + failure : "handler sent no response";
          writer.send(500, "application/json", error_body(500, message_text), {});
        } else if (failed || writer.state() == ConnectionWriter::State::kStreaming) {
          must_close = true;  // a response is half written: only closing ends it
        }
      } catch (...) {
        must_close = true;
      }
      end_request(id);
      if (must_close || writer.gone() || !writer.keep_alive()) return;
    }
  }

  void join_finished() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex);
      for (const uint64_t id : finished) {
        auto it = connections.find(id);
        if (it == connections.end()) continue;
        threads.push_back(std::move(it->second.thread));
        connections.erase(it);
      }
      finished.clear();
    }
    for (auto& thread : threads) {
      if (thread.joinable()) thread.join();
    }
  }

  // Caller holds lifecycle_mutex.
  void stop_accepting_locked() {
    if (listener_closed) return;
    if (accept_thread.joinable()) {
      const uint64_t one = 1;
      [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
      accept_thread.join();
    }
    error_code ec;
    acceptor.close(ec);
    listener_closed = true;
  }

  void shutdown_connections(bool idle_only) {  // caller holds mutex
    for (auto& [id, connection] : connections) {
      if (connection.fd >= 0 && !(idle_only && connection.busy)) ::shutdown(connection.fd, SHUT_RDWR);
    }
  }

  void stop(std::chrono::milliseconds grace) {
    std::lock_guard lifecycle(lifecycle_mutex);
    stop_accepting_locked();
    std::vector<std::thread> threads;
    {
      std::unique_lock lock(mutex);
      stopping = true;
      shutdown_connections(/*idle_only=*/true);  // nothing to wait for on those
      request_done.wait_for(lock, grace, [&] { return busy_connections == 0; });
      // Handlers still running now see their writes fail and client_gone().
      shutdown_connections(/*idle_only=*/false);
      for (auto& [id, connection] : connections) {
        if (connection.thread.joinable()) threads.push_back(std::move(connection.thread));
      }
    }
    for (auto& thread : threads) thread.join();
    std::lock_guard lock(mutex);
    connections.clear();
    finished.clear();
  }
};

Server::Server(ServerOptions options, Handler handler) : impl_(std::make_unique<Impl>()) {
  if (!handler) throw Error(ErrorCode::kInvalidArgument, "http::Server needs a handler");
  if (options.max_connections < 1) throw Error(ErrorCode::kInvalidArgument, "max_connections must be at least 1");
  impl_->options = std::move(options);
  impl_->handler = std::move(handler);
  impl_->listen();
}

Server::~Server() {
  stop();
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

uint16_t Server::port() const { return impl_->bound_port; }

void Server::start() {
  std::lock_guard lifecycle(impl_->lifecycle_mutex);
  if (impl_->listener_closed) throw Error(ErrorCode::kInternal, "http::Server::start after stop");
  if (impl_->accept_thread.joinable()) return;
  impl_->accept_thread = std::thread([this] { impl_->accept_loop(); });
}

void Server::stop_accepting() {
  std::lock_guard lifecycle(impl_->lifecycle_mutex);
  impl_->stop_accepting_locked();
}

void Server::stop(std::chrono::milliseconds grace) { impl_->stop(grace); }

int Server::active_connections() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->open_connections;
}

}  // namespace lazykv::http
