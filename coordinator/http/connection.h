// One accepted connection, driven by the server's I/O threads. It reads each
// request asynchronously under deadlines, answers what it can itself
// (malformed or oversize requests, timeouts, refusals, probes, the header
// check's answers) and hands the rest to a handler thread, taking the
// connection back when the handler returns. Internal to http_server.cc.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "coordinator/http/handler_pool.h"
#include "coordinator/http/http_server.h"

namespace lazykv::http::detail {

class Connection;

// How a new connection is taken: within the caps, past them for a probe
// only, or turned away with a 503.
enum class Admission { kNormal, kProbeOnly, kRefused };

// What every connection of one server shares. The server owns it and
// outlives its connections.
struct ServerState {
  ServerState(ServerOptions options, Handler handler);

  const ServerOptions options;
  const Handler handler;
  HandlerPool handlers;
  std::atomic<bool> stopping{false};
  std::atomic<size_t> body_bytes{0};  // bodies being read or handled (reserved)

  mutable std::mutex mutex;         // what follows
  std::condition_variable changed;  // a connection ended or a handler returned
  std::unordered_map<const Connection*, std::weak_ptr<Connection>> connections;
  std::unordered_map<std::string, int> per_address;  // kNormal connections by client address
  int normal = 0;
  int probes = 0;
  int refusals = 0;
  int busy = 0;  // requests with a handler thread, queued or running

  // Takes a slot for a connection from `address` (its bytes), or nullopt
  // when even a refusal costs too much now (the socket is then just closed).
  std::optional<Admission> admit(const std::string& address);
  // Gives back the slot of a connection that ends (and forgets it).
  void release(Admission admission, const std::string& address, const Connection* connection);
  // Reserves `bytes` of the body budget; false when it is spent.
  bool reserve_body(size_t bytes);
  std::string error_body(int status, const std::string& message) const;
  bool is_probe(const std::string& path) const;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Socket = boost::asio::ip::tcp::socket;

  Connection(ServerState& state, Socket socket, std::string remote, std::string address, Admission admission);
  ~Connection();  // releases its slot
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void start();  // registers with the state, then reads (or refuses) on the connection's I/O thread
  // Server::stop: closes the connection unless a handler owns it. Any thread.
  void close_if_idle();
  // Server::stop past its grace: shuts the socket down under a running
  // handler, whose writes then fail. Caller holds state.mutex.
  void cut_under_handler() const;

 private:
  using Clock = std::chrono::steady_clock;
  enum class Phase { kIdle, kHeader, kBody, kHandler, kWriting, kLinger, kClosed };

  void wait_for_request();
  void read_header();
  void on_header(const boost::beast::error_code& ec);
  void read_body();
  void read_body_some();
  void on_read_error(const boost::beast::error_code& ec);
  void dispatch();
  void answer_probe();
  void run_handler(int fd);  // on a handler thread
  void after_handler(bool must_close);
  // The server's own answer, then a lingering close (see kLingerTime).
  void answer_and_close(int status, const std::string& message);
  void send_and_close(EarlyAnswer answer);
  void write_then(std::function<void(bool ok)> next);
  void linger(std::chrono::milliseconds time);
  void drain_input();
  void close();

  std::chrono::milliseconds header_timeout() const;
  Clock::time_point deadline() const;
  void arm_deadline();
  void on_deadline();
  void release_body();

  ServerState& state_;
  Socket socket_;
  boost::asio::steady_timer timer_;
  const std::string remote_;
  const std::string address_;
  const Admission admission_;

  Phase phase_ = Phase::kIdle;
  bool first_request_ = true;
  bool timed_out_ = false;
  bool timer_armed_ = false;  // a wait is pending on timer_ (until timer_.expiry())
  boost::beast::flat_buffer buffer_;  // keeps bytes past one request (pipelining)
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  Request request_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;
  size_t body_reserved_ = 0;
  std::shared_ptr<boost::beast::http::response<boost::beast::http::string_body>> response_;  // own answer in flight

  Clock::time_point idle_deadline_{};
  Clock::time_point header_deadline_{};
  Clock::time_point body_started_{};
  size_t body_received_ = 0;
  Clock::time_point io_deadline_{};  // writing an own answer, lingering

  int handler_fd_ = -1;  // guarded by state_.mutex: the socket, while a handler owns it
};

}  // namespace lazykv::http::detail
