// The listener and the lifecycle. Each I/O thread runs an io_context of its
// own, and connections are spread over them as they are accepted: a
// connection's reads, writes and deadline always run on one thread, with no
// hand-off between threads on the way (the acceptor lives on the first).
// Handler threads come from a HandlerPool (connection.cc).
#include "coordinator/http/http_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "coordinator/http/connection.h"

namespace lazykv::http {

std::string_view Request::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return value;
  }
  return {};
}

namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using boost::system::error_code;

// Connections accepted per wake-up of the acceptor, so that a burst of
// connects does not starve the connections sharing its thread.
constexpr int kAcceptBatch = 64;
// Out of descriptors: how long accepting pauses instead of spinning.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(50);
// How long stop() waits for closed connections to be released.
constexpr auto kReleaseWait = std::chrono::seconds(10);

std::string endpoint_text(const tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  const std::string host = address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
  return host + ":" + std::to_string(endpoint.port());
}

void check_options(const ServerOptions& options) {
  const auto require = [](bool ok, const char* what) {
    if (!ok) throw Error(ErrorCode::kInvalidArgument, std::string("http::Server: ") + what);
  };
  require(options.max_connections >= 1, "max_connections must be at least 1");
  require(options.max_connections_per_address >= 0, "max_connections_per_address must be >= 0");
  require(options.probe_slots >= 0, "probe_slots must be >= 0");
  require(options.io_threads >= 1, "io_threads must be at least 1");
  require(options.handler_threads >= 1, "handler_threads must be at least 1");
  require(options.max_body_memory >= options.max_body_bytes, "max_body_memory must be at least max_body_bytes");
  require(options.header_timeout.count() > 0 && options.probe_header_timeout.count() > 0 &&
              options.body_timeout.count() > 0 && options.keep_alive_timeout.count() > 0 &&
              options.write_timeout.count() > 0,
          "timeouts must be positive");
}

}  // namespace

struct Server::Impl {
  using WorkGuard = net::executor_work_guard<net::io_context::executor_type>;

  Impl(ServerOptions options, Handler handler) : state(std::move(options), std::move(handler)) {
    for (int i = 0; i < state.options.io_threads; ++i) contexts.push_back(std::make_unique<net::io_context>(1));
    acceptor.emplace(*contexts.front());
    accept_backoff.emplace(*contexts.front());
  }

  detail::ServerState state;  // first: connections still queued in `contexts` refer to it
  std::vector<std::unique_ptr<net::io_context>> contexts;  // one per I/O thread
  std::optional<tcp::acceptor> acceptor;                   // on contexts[0], as all below
  std::optional<net::steady_timer> accept_backoff;
  size_t next_context = 0;  // where the next connection goes (round robin)
  std::vector<WorkGuard> work;
  std::vector<std::thread> io_threads;
  uint16_t bound_port = 0;

  std::mutex lifecycle_mutex;  // start / stop_accepting / stop
  bool started = false;
  bool listener_closed = false;
  bool stopped = false;

  void listen() {
    const ServerOptions& options = state.options;
    error_code ec;
    auto address = net::ip::make_address(options.host, ec);
    if (ec) {  // a host name: take its first address
      tcp::resolver resolver(*contexts.front());
      const auto results = resolver.resolve(options.host, std::to_string(options.port), ec);
      if (!ec && results.begin() != results.end()) address = results.begin()->endpoint().address();
    }
    const tcp::endpoint endpoint(address, options.port);
    if (!ec) acceptor->open(endpoint.protocol(), ec);
    if (!ec) acceptor->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor->bind(endpoint, ec);
    if (!ec) acceptor->listen(net::socket_base::max_listen_connections, ec);
    if (!ec) acceptor->non_blocking(true, ec);
    if (!ec) bound_port = acceptor->local_endpoint(ec).port();
    if (ec) {
      throw Error(ErrorCode::kIo,
                  "cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " + ec.message());
    }
    // Child processes (the tests run curl) must not inherit the listener.
    ::fcntl(acceptor->native_handle(), F_SETFD, FD_CLOEXEC);
  }

  // Accepting is done by hand (accept4) so that every socket is
  // close-on-exec from the start and the peer address comes with it.
  void accept_next() {
    acceptor->async_wait(tcp::acceptor::wait_read, [this](const error_code& ec) {
      if (!ec) accept_ready();
    });
  }

  void accept_ready() {
    for (int i = 0; i < kAcceptBatch; ++i) {
      sockaddr_storage peer{};
      socklen_t peer_size = sizeof peer;
      const int fd = ::accept4(acceptor->native_handle(), reinterpret_cast<sockaddr*>(&peer), &peer_size,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        take(fd, peer, peer_size);
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_backoff->expires_after(kAcceptBackoff);
        accept_backoff->async_wait([this](const error_code& ec) {
          if (!ec) accept_next();
        });
        return;
      }
      break;  // EAGAIN: nothing more to accept now
    }
    accept_next();
  }

  void take(int fd, const sockaddr_storage& peer, socklen_t peer_size) {
    tcp::endpoint endpoint;  // IPv4 or IPv6: always fits
    const size_t address_size = std::min<size_t>(peer_size, endpoint.capacity());
    std::memcpy(endpoint.data(), &peer, address_size);
    endpoint.resize(address_size);
    const std::string address = endpoint.address().to_string();
    const std::optional<detail::Admission> admission = state.admit(address);
    if (!admission) {
      ::close(fd);
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small chunks go out at once
    try {
      tcp::socket socket(*contexts[next_context++ % contexts.size()]);
      socket.assign(endpoint.protocol(), fd);
      std::make_shared<detail::Connection>(state, std::move(socket), endpoint_text(endpoint), address, *admission)
          ->start();
    } catch (const std::exception&) {  // out of memory: the socket closes with the failure
      state.release(*admission, address, nullptr);
    }
  }

  // Caller holds lifecycle_mutex.
  void stop_accepting_locked() {
    if (listener_closed) return;
    listener_closed = true;
    const auto close_listener = [this] {
      error_code ignored;
      acceptor->close(ignored);
      accept_backoff->cancel();
    };
    if (!started) return close_listener();
    std::promise<void> closed;
    net::post(*contexts.front(), [&] {
      close_listener();
      closed.set_value();
    });
    closed.get_future().wait();
  }

  std::vector<std::shared_ptr<detail::Connection>> live_connections() {
    std::vector<std::shared_ptr<detail::Connection>> live;
    std::lock_guard lock(state.mutex);
    for (const auto& [raw, weak] : state.connections) {
      if (auto connection = weak.lock()) live.push_back(std::move(connection));
    }
    return live;
  }

  void close_idle_connections() {
    // Released outside the lock: the last owner's destructor takes it.
    for (const auto& connection : live_connections()) connection->close_if_idle();
  }

  void stop(std::chrono::milliseconds grace) {
    std::lock_guard lifecycle(lifecycle_mutex);
    stop_accepting_locked();
    if (stopped) return;
    stopped = true;
    state.stopping = true;
    if (!started) return;
    close_idle_connections();
    {
      std::unique_lock lock(state.mutex);
      state.changed.wait_for(lock, grace, [&] { return state.busy == 0; });
      // Handlers still running now see their writes fail and client_gone().
      for (const auto& [raw, weak] : state.connections) raw->cut_under_handler();
      state.changed.wait(lock, [&] { return state.busy == 0; });
    }
    close_idle_connections();  // those whose handler just returned
    {
      std::unique_lock lock(state.mutex);
      state.changed.wait_for(lock, kReleaseWait, [&] { return state.connections.empty(); });
    }
    work.clear();
    for (auto& context : contexts) context->stop();
    for (std::thread& thread : io_threads) thread.join();
    io_threads.clear();
    state.handlers.join();
  }
};

Server::Server(ServerOptions options, Handler handler) {
  if (!handler) throw Error(ErrorCode::kInvalidArgument, "http::Server needs a handler");
  check_options(options);
  impl_ = std::make_unique<Impl>(std::move(options), std::move(handler));
  impl_->listen();
}

Server::~Server() { stop(); }

uint16_t Server::port() const { return impl_->bound_port; }

void Server::start() {
  std::lock_guard lifecycle(impl_->lifecycle_mutex);
  if (impl_->listener_closed) throw Error(ErrorCode::kInternal, "http::Server::start after stop");
  if (impl_->started) return;
  impl_->started = true;
  for (auto& context : impl_->contexts) {
    net::io_context* io = context.get();
    impl_->work.push_back(net::make_work_guard(*io));
    impl_->io_threads.emplace_back([io] {
      for (;;) {
        try {
          io->run();
          return;
        } catch (...) {
          // A completion handler threw (only allocation can): keep serving.
        }
      }
    });
  }
  net::post(*impl_->contexts.front(), [this] { impl_->accept_next(); });
}

void Server::stop_accepting() {
  std::lock_guard lifecycle(impl_->lifecycle_mutex);
  impl_->stop_accepting_locked();
}

void Server::stop(std::chrono::milliseconds grace) { impl_->stop(grace); }

int Server::active_connections() const {
  std::lock_guard lock(impl_->state.mutex);
  return impl_->state.normal + impl_->state.probes;
}

size_t Server::body_memory_in_use() const { return impl_->state.body_bytes.load(); }

}  // namespace lazykv::http
