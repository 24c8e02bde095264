// A connection's life, all on its I/O thread except run_handler():
//
//   kIdle --first byte--> kHeader --header--> [kBody] --> kHandler --> kIdle ...
//                            |                  |            (or a probe, answered here)
//                            +------------------+--> kWriting (own answer) --> kLinger --> kClosed
//
// Each phase but kHandler has a deadline (deadline()); one timer enforces it.
// When it passes, the pending read or write is cancelled and its completion
// answers 408 or closes. The body's deadline moves with what has arrived,
// so the timer re-arms itself until the client falls behind the rate.
#include "coordinator/http/connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "coordinator/http/response_fields.h"
#include "coordinator/http/socket_writer.h"

namespace lazykv::http::detail {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using beast::error_code;

// Large enough for any sane request line and headers, small enough that a
// client cannot make the server buffer without bound before the body limit.
constexpr size_t kHeaderLimit = 64 * 1024;
// After an answer that closes the connection, the server reads and drops
// what the client still sends for at most this long: closing a socket with
// unread input resets the connection, and the client could lose the answer.
constexpr auto kLingerTime = std::chrono::milliseconds(2000);
// A connection turned away lingers much shorter.
constexpr auto kRefusalLingerTime = std::chrono::milliseconds(100);
// The server's own answers are small: a client that does not take one in
// within this time is dropped.
constexpr auto kOwnAnswerWriteTimeout = std::chrono::milliseconds(5000);
// Refusals (503) being written at once; past it, sockets close unanswered.
constexpr int kMaxRefusals = 256;

std::string to_std(beast::string_view text) { return std::string(text.data(), text.size()); }

std::string default_error_body(int status, const std::string& message) {
  const nlohmann::json body = {
      {"error", {{"message", message}, {"type", status >= 500 ? "server_error" : "invalid_request_error"}}}};
  // Messages may quote client bytes: never fail on invalid UTF-8.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string seconds_text(std::chrono::milliseconds time) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", double(time.count()) / 1000.0);
  return text;
}

// Errors of a request the client sent wrong (answered 400), as opposed to
// the connection ending or timing out (closed without an answer).
bool is_protocol_error(const error_code& ec) {
  static const auto& http_category = bhttp::make_error_code(bhttp::error::bad_method).category();
  return ec.category() == http_category && ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message &&
         ec != bhttp::error::need_more && ec != bhttp::error::need_buffer;
}

// The handler's writer for a probe path, answered on the I/O thread: it
// keeps the one whole response the handler sends.
class ProbeWriter final : public ResponseWriter {
 public:
  ProbeWriter(unsigned version, bool keep_alive) : version_(version), keep_alive_(keep_alive) {}

  bool send(int status, std::string_view content_type, std::string body, const Headers& extra) override {
    if (response_) throw Error(ErrorCode::kInternal, "ResponseWriter::send: a response was already started");
    validate_status(status);
    response_ = std::make_shared<bhttp::response<bhttp::string_body>>();
    response_->version(version_);
    response_->result(static_cast<unsigned>(status));
    set_common_fields(*response_, content_type, extra);
    response_->keep_alive(keep_alive_);
    response_->body() = std::move(body);
    response_->prepare_payload();
    return true;
  }
  bool start_stream(int, std::string_view, const Headers&) override { throw not_here("start_stream"); }
  bool write_chunk(std::string_view) override { throw not_here("write_chunk"); }
  bool end_stream() override { throw not_here("end_stream"); }
  bool client_gone() override { return false; }

  std::shared_ptr<bhttp::response<bhttp::string_body>> take() { return std::move(response_); }

 private:
  static Error not_here(const char* call) {
    return Error(ErrorCode::kInternal, std::string("ResponseWriter::") + call + ": a probe path answers whole");
  }

  unsigned version_;
  bool keep_alive_;
  std::shared_ptr<bhttp::response<bhttp::string_body>> response_;
};

}  // namespace

// --- ServerState ---------------------------------------------------------------

ServerState::ServerState(ServerOptions options_in, Handler handler_in)
    : options(std::move(options_in)), handler(std::move(handler_in)), handlers(options.handler_threads) {}

std::optional<Admission> ServerState::admit(const std::string& address) {
  std::lock_guard lock(mutex);
  const int cap = options.max_connections_per_address;
  const auto from_address = per_address.find(address);
  const int open_from_address = from_address == per_address.end() ? 0 : from_address->second;
  if (!stopping && normal < options.max_connections && (cap <= 0 || open_from_address < cap)) {
    ++normal;
    ++per_address[address];
    return Admission::kNormal;
  }
  if (!stopping && probes < options.probe_slots) {
    ++probes;
    return Admission::kProbeOnly;
  }
  if (refusals < kMaxRefusals) {
    ++refusals;
    return Admission::kRefused;
  }
  return std::nullopt;
}

void ServerState::release(Admission admission, const std::string& address, const Connection* connection) {
  {
    std::lock_guard lock(mutex);
    connections.erase(connection);
    switch (admission) {
      case Admission::kNormal: {
        --normal;
        const auto it = per_address.find(address);
        if (it != per_address.end() && --it->second <= 0) per_address.erase(it);
        break;
      }
      case Admission::kProbeOnly: --probes; break;
      case Admission::kRefused: --refusals; break;
    }
  }
  changed.notify_all();
}

bool ServerState::reserve_body(size_t bytes) {
  size_t current = body_bytes.load();
  do {
    if (current + bytes > options.max_body_memory) return false;
  } while (!body_bytes.compare_exchange_weak(current, current + bytes));
  return true;
}

std::string ServerState::error_body(int status, const std::string& message) const {
  return options.error_body ? options.error_body(status, message) : default_error_body(status, message);
}

bool ServerState::is_probe(const std::string& path) const {
  return std::find(options.probe_paths.begin(), options.probe_paths.end(), path) != options.probe_paths.end();
}

// --- Connection: reading -----------------------------------------------------------

Connection::Connection(ServerState& state, Socket socket, std::string remote, std::string address,
                       Admission admission)
    : state_(state),
      socket_(std::move(socket)),
      timer_(socket_.get_executor()),
      remote_(std::move(remote)),
      address_(std::move(address)),
      admission_(admission) {}

Connection::~Connection() {
  release_body();
  state_.release(admission_, address_, this);
}

void Connection::start() {
  {
    std::lock_guard lock(state_.mutex);
    state_.connections.emplace(this, weak_from_this());
  }
  net::dispatch(socket_.get_executor(), [self = shared_from_this()] {
    if (self->admission_ == Admission::kRefused) {
      return self->answer_and_close(503, self->state_.stopping ? "server is shutting down" : "too many connections");
    }
    self->wait_for_request();
  });
}

std::chrono::milliseconds Connection::header_timeout() const {
  return admission_ == Admission::kProbeOnly ? state_.options.probe_header_timeout : state_.options.header_timeout;
}

void Connection::wait_for_request() {
  if (state_.stopping) return close();
  const auto now = Clock::now();
  if (buffer_.size() > 0) {  // the next request is here already (pipelining)
    header_deadline_ = now + header_timeout();
    return read_header();
  }
  buffer_.shrink_to_fit();  // an idle connection holds no buffer
  phase_ = Phase::kIdle;
  if (first_request_) {  // from accept: the whole header within the header timeout
    header_deadline_ = now + header_timeout();
    idle_deadline_ = header_deadline_;
  } else {
    idle_deadline_ = now + state_.options.keep_alive_timeout;
  }
  arm_deadline();
  socket_.async_wait(Socket::wait_read, [self = shared_from_this()](const error_code& ec) {
    if (self->phase_ == Phase::kClosed) return;
    if (ec) return self->on_read_error(ec);
    if (!self->first_request_) self->header_deadline_ = Clock::now() + self->header_timeout();
    self->read_header();
  });
}

void Connection::read_header() {
  phase_ = Phase::kHeader;
  arm_deadline();
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(state_.options.max_body_bytes);
  bhttp::async_read_header(socket_, buffer_, *parser_,
                           [self = shared_from_this()](const error_code& ec, size_t) { self->on_header(ec); });
}

void Connection::on_header(const error_code& ec) {
  if (phase_ == Phase::kClosed) return;  // closed while the read was finishing
  if (ec) return on_read_error(ec);
  auto& message = parser_->get();
  version_ = message.version();
  keep_alive_ = message.keep_alive();
  head_ = message.method() == bhttp::verb::head;
  request_ = Request{};
  request_.method = to_std(message.method_string());
  const std::string target = to_std(message.target());
  const size_t question = target.find('?');
  request_.path = target.substr(0, question);
  if (question != std::string::npos) request_.query = target.substr(question + 1);
  for (const auto& field : message.base()) {
    std::string name = to_std(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    request_.headers.emplace_back(std::move(name), to_std(field.value()));
  }
  request_.remote = remote_;

  if (admission_ == Admission::kProbeOnly && !state_.is_probe(request_.path)) {
    return answer_and_close(503, "too many connections");
  }
  if (state_.stopping) return answer_and_close(503, "server is shutting down");
  if (state_.options.check_header) {
    std::optional<EarlyAnswer> answer;
    try {
      answer = state_.options.check_header(request_);
    } catch (const std::exception& e) {
      return answer_and_close(500, std::string("internal error: ") + e.what());
    }
    if (answer) return send_and_close(std::move(*answer));
  }
  if (parser_->is_done()) return dispatch();
  // A chunked body may grow to the limit: it reserves all of it.
  const auto length = parser_->content_length();
  const size_t need = length ? size_t(*length) : state_.options.max_body_bytes;
  if (!state_.reserve_body(need)) {
    return answer_and_close(503, "too many request bodies are being read; retry later");
  }
  body_reserved_ = need;
  if (beast::iequals(message[bhttp::field::expect], "100-continue")) {
    response_ = std::make_shared<bhttp::response<bhttp::string_body>>(bhttp::status::continue_, version_);
    return write_then([self = shared_from_this()](bool ok) {
      if (!ok) return self->close();
      self->read_body();
    });
  }
  read_body();
}

void Connection::read_body() {
  phase_ = Phase::kBody;
  body_started_ = Clock::now();
  body_received_ = 0;
  arm_deadline();
  read_body_some();
}

void Connection::read_body_some() {
  bhttp::async_read_some(socket_, buffer_, *parser_, [self = shared_from_this()](const error_code& ec, size_t n) {
    if (self->phase_ == Phase::kClosed) return;
    if (ec) return self->on_read_error(ec);
    self->body_received_ += n;
    if (!self->parser_->is_done()) return self->read_body_some();
    self->dispatch();
  });
}

void Connection::on_read_error(const error_code& ec) {
  if (phase_ == Phase::kClosed) return;
  const ServerOptions& options = state_.options;
  if (timed_out_) {
    if (phase_ == Phase::kHeader) {
      return answer_and_close(408, "the request header did not arrive within " + seconds_text(header_timeout()));
    }
    if (phase_ == Phase::kBody) {
      return answer_and_close(408, "the request body arrived too slowly (allowed: " +
                                       seconds_text(options.body_timeout) + " plus 1 s per " +
                                       std::to_string(options.min_body_rate) + " bytes)");
    }
    return close();  // idle past the keep-alive timeout: no request to answer
  }
  if (ec == bhttp::error::body_limit) {
    return answer_and_close(413, "request body exceeds " + std::to_string(options.max_body_bytes) + " bytes");
  }
  if (ec == bhttp::error::header_limit) {
    return answer_and_close(431, "request header exceeds " + std::to_string(kHeaderLimit) + " bytes");
  }
  if (is_protocol_error(ec)) return answer_and_close(400, "malformed HTTP request: " + ec.message());
  close();  // the client closed or reset, or the server is stopping
}

// --- Connection: answering ---------------------------------------------------------

void Connection::dispatch() {
  request_.body = std::move(parser_->get().body());
  parser_.reset();
  if (state_.is_probe(request_.path)) return answer_probe();
  phase_ = Phase::kHandler;
  timer_.cancel();
  timer_armed_ = false;
  const int fd = socket_.native_handle();
  {
    std::lock_guard lock(state_.mutex);
    handler_fd_ = fd;
    ++state_.busy;
  }
  state_.handlers.submit([self = shared_from_this(), fd] { self->run_handler(fd); });
}

void Connection::run_handler(int fd) {
  SocketWriter writer(fd, version_, keep_alive_, head_, state_.stopping, state_.options.write_timeout);
  std::string failure;
  bool failed = false;
  try {
    state_.handler(request_, writer);
  } catch (const std::exception& e) {
    failed = true;
    failure = e.what();
  } catch (...) {
    failed = true;
    failure = "unknown exception";
  }
  bool must_close = false;
  try {
    if (writer.state() == SocketWriter::State::kNothingSent) {
      const std::string message = failed ? "internal error: " + failure : "handler sent no response";
      writer.send(500, "application/json", state_.error_body(500, message), {});
    } else if (failed || writer.state() == SocketWriter::State::kStreaming) {
      must_close = true;  // a response is half written: only closing ends it
    }
  } catch (...) {
    must_close = true;
  }
  must_close = must_close || writer.gone() || !writer.keep_alive();
  request_ = Request{};  // the body's memory goes back now
  release_body();
  {
    std::lock_guard lock(state_.mutex);
    handler_fd_ = -1;
    --state_.busy;
  }
  state_.changed.notify_all();
  net::post(socket_.get_executor(), [self = shared_from_this(), must_close] { self->after_handler(must_close); });
}

void Connection::after_handler(bool must_close) {
  if (phase_ == Phase::kClosed) return;
  if (must_close || state_.stopping) return close();
  first_request_ = false;
  wait_for_request();
}

void Connection::answer_probe() {
  const bool keep_alive = keep_alive_ && admission_ == Admission::kNormal && !state_.stopping;
  ProbeWriter writer(version_, keep_alive);
  try {
    state_.handler(request_, writer);
  } catch (const std::exception& e) {
    return answer_and_close(500, std::string("internal error: ") + e.what());
  }
  response_ = writer.take();
  if (!response_) return answer_and_close(500, "handler sent no response");
  if (head_) response_->body().clear();  // Content-Length stays that of the body
  request_ = Request{};
  write_then([self = shared_from_this(), keep_alive](bool ok) {
    if (!ok || !keep_alive) return self->close();
    self->first_request_ = false;
    self->wait_for_request();
  });
}

void Connection::answer_and_close(int status, const std::string& message) {
  if (state_.options.on_own_answer) state_.options.on_own_answer(status);
  EarlyAnswer answer;
  answer.status = status;
  answer.body = state_.error_body(status, message);
  // A 503 passes: say when to retry, as every 503 of the API does.
  if (status == 503) answer.headers.emplace_back("Retry-After", "1");
  send_and_close(std::move(answer));
}

void Connection::send_and_close(EarlyAnswer answer) {
  response_ = std::make_shared<bhttp::response<bhttp::string_body>>();
  response_->version(11);
  response_->result(static_cast<unsigned>(answer.status));
  set_common_fields(*response_, answer.content_type, answer.headers);
  response_->keep_alive(false);
  response_->body() = std::move(answer.body);
  response_->prepare_payload();
  write_then([self = shared_from_this()](bool ok) {
    if (!ok) return self->close();
    self->linger(self->admission_ == Admission::kRefused ? kRefusalLingerTime : kLingerTime);
  });
}

void Connection::write_then(std::function<void(bool ok)> next) {
  phase_ = Phase::kWriting;
  io_deadline_ = Clock::now() + std::min<std::chrono::milliseconds>(kOwnAnswerWriteTimeout, state_.options.write_timeout);
  arm_deadline();
  bhttp::async_write(socket_, *response_,
                     [self = shared_from_this(), next = std::move(next)](const error_code& ec, size_t) {
                       self->response_.reset();
                       next(!ec && self->phase_ != Phase::kClosed);
                     });
}

void Connection::linger(std::chrono::milliseconds time) {
  phase_ = Phase::kLinger;
  io_deadline_ = Clock::now() + time;
  arm_deadline();
  error_code ignored;
  socket_.shutdown(Socket::shutdown_send, ignored);
  drain_input();
}

void Connection::drain_input() {
  buffer_.consume(buffer_.size());
  socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](const error_code& ec, size_t) {
    if (ec) return self->close();  // the client closed, or the linger time is up
    self->drain_input();
  });
}

void Connection::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  timer_.cancel();
  timer_armed_ = false;
  error_code ignored;
  socket_.close(ignored);
  // The parser and buffers stay: a read cancelled by the close may still be
  // finishing in them. They go with the connection.
  release_body();
}

void Connection::close_if_idle() {
  net::post(socket_.get_executor(), [self = shared_from_this()] {
    if (self->phase_ != Phase::kHandler) self->close();
  });
}

void Connection::cut_under_handler() const {
  if (handler_fd_ >= 0) ::shutdown(handler_fd_, SHUT_RDWR);
}

void Connection::release_body() {
  if (body_reserved_ > 0) state_.body_bytes -= body_reserved_;
  body_reserved_ = 0;
}

// --- Connection: deadlines ---------------------------------------------------------

Connection::Clock::time_point Connection::deadline() const {
  switch (phase_) {
    case Phase::kIdle: return idle_deadline_;
    case Phase::kHeader: return header_deadline_;
    case Phase::kBody: {
      auto allowed = std::chrono::duration_cast<Clock::duration>(state_.options.body_timeout);
      if (state_.options.min_body_rate > 0) {
        allowed += std::chrono::milliseconds(body_received_ * 1000 / state_.options.min_body_rate);
      }
      return body_started_ + allowed;
    }
    case Phase::kWriting:
    case Phase::kLinger: return io_deadline_;
    case Phase::kHandler:
    case Phase::kClosed: break;
  }
  return Clock::time_point::max();
}

// The timer is re-armed only when the deadline moves earlier than the armed
// expiry: a later one (the next keep-alive wait, a body earning time) is
// found when the armed expiry passes, so a request costs about one timer
// update rather than one per phase.
void Connection::arm_deadline() {
  const Clock::time_point due = deadline();
  if (timer_armed_ && timer_.expiry() <= due) return;
  timer_armed_ = true;
  timer_.expires_at(due);
  timer_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (!ec) self->on_deadline();
  });
}

void Connection::on_deadline() {
  timer_armed_ = false;
  if (phase_ == Phase::kHandler || phase_ == Phase::kClosed) return;
  if (Clock::now() < deadline()) return arm_deadline();  // not due yet: the deadline moved later
  timed_out_ = true;
  error_code ignored;
  socket_.cancel(ignored);  // the pending read or write completes with operation_aborted
}

}  // namespace lazykv::http::detail
